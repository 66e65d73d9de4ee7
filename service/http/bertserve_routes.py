"""bertserve.v1 over JSON: one POST route per RPC, with the RPC's fields (snake_case, as in
protos/bertserve/v1/inference.proto), limits and error messages; the answers mirror the proto messages.

    POST /bertserve/v1/embed      see embed_routes.py
    POST /bertserve/v1/fill-mask  {"inputs": [...], "model"?, "top_k"?, "truncate"?}
    POST /bertserve/v1/classify   {"inputs": [...], "pairs"?: [...], "model"?, "top_k"?, "raw_scores"?,
                                   "truncate"?, "truncation_strategy"?}
    POST /bertserve/v1/rerank     {"query", "documents": [...], "model"?, "top_n"?, "return_documents"?,
                                   "raw_scores"?, "truncate"? (default true)}
    POST /bertserve/v1/score      {"texts_1": [...], "texts_2": [...], "model"?, "raw_scores"?, "truncate"?,
                                   "truncation_strategy"?}
    POST /bertserve/v1/tokenize   {"inputs": [...], "model"?, "truncate"?}
    POST /bertserve/v1/attention  {"input": "...", "model"?, "layers"?, "heads"?, "truncate"?}
    GET  /bertserve/v1/info       (POST {} too)
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from bertserve.service.core.results import (
    AttentionResult,
    CallMeta,
    ClassifyResult,
    FillMaskResult,
    TokenizeResult,
)
from bertserve.service.engine.tokenization import EncodedInput
from bertserve.service.http.json_body import off_loop_above
from bertserve.service.http.pair_fields import PAIR_TEXTS, documents, top_n
from bertserve.service.http.routing import Call, Route
from bertserve.service.http.schema import Fields, json_object
from bertserve.service.http.transport import Response, json_response

if TYPE_CHECKING:
    from bertserve.service.core.results import RerankResult, ScoreResult
    from bertserve.service.http.app import HttpFront

PREFIX = "/bertserve/v1"
# Bounds on what the attention reply's JSON spends: a probability as a float's shortest repr with its
# comma (at most 23 bytes: "1.2345678901234567e-05,"); a token's entry (its text escaped as \uXXXX).
JSON_PROBABILITY_BYTES = 23
JSON_TOKEN_BYTES = 160
JSON_ENTRY_BYTES = 64  # a candidate, label or token entry: to decide which replies are built off the loop


def metadata(meta: CallMeta) -> dict:
    return {
        "model": meta.model,
        "model_version": meta.version,
        "total_tokens": meta.total_tokens,
        "input_tokens": meta.input_tokens,
        "truncated": meta.truncated,
        "queue_time_ms": 1000 * meta.queue_s,
        "inference_time_ms": 1000 * meta.inference_s,
        "tokenize_time_ms": 1000 * meta.tokenize_s,
        "batches": meta.batches,
    }


def tokens(encoded: EncodedInput) -> list[dict]:
    return [
        {"text": text, "id": int(token_id), "start": start, "end": end, "special": special}
        for text, token_id, (start, end), special in zip(
            encoded.tokens, encoded.ids.tolist(), encoded.offsets, encoded.special, strict=True
        )
    ]


async def _request(
    front: HttpFront, call: Call, *extra: str, texts_per_input: int = 1
) -> tuple[Fields, list[str], str, bool]:
    body = await json_object(front, call.request, texts_per_input)
    fields = Fields(body, ("inputs", "model", "truncate", *extra))
    return fields, fields.strings("inputs"), fields.string("model"), fields.boolean("truncate")


def _fill_mask_reply(result: FillMaskResult) -> Response:
    results = [
        {
            "masks": [
                {
                    "position": mask.position,
                    "candidates": [
                        {
                            "token": token,
                            "token_id": int(token_id),
                            "score": float(score),
                            "sequence": sequence,
                        }
                        for token, token_id, score, sequence in zip(
                            mask.tokens,
                            mask.token_ids.tolist(),
                            mask.scores.tolist(),
                            mask.sequences,
                            strict=True,
                        )
                    ],
                }
                for mask in masks
            ]
        }
        for masks in result.masks
    ]
    return json_response(200, {"results": results, "metadata": metadata(result.meta)})


async def fill_mask(front: HttpFront, call: Call) -> Response:
    fields, inputs, model, truncate = await _request(front, call, "top_k")
    result = await front.core.fill_mask(
        model, inputs, truncate=truncate, top_k=fields.integer("top_k"), deadline=call.deadline
    )
    candidates = sum(len(mask.tokens) for masks in result.masks for mask in masks)
    return await off_loop_above(front, JSON_ENTRY_BYTES * candidates, _fill_mask_reply, result)


def _classify_reply(result: ClassifyResult) -> Response:
    results = [
        {"labels": [{"label": s.label, "index": s.index, "score": float(s.score)} for s in labels]}
        for labels in result.labels
    ]
    return json_response(200, {"results": results, "metadata": metadata(result.meta)})


async def classify(front: HttpFront, call: Call) -> Response:
    extra = ("top_k", "raw_scores", "pairs", "truncation_strategy")
    fields, inputs, model, truncate = await _request(front, call, *extra, texts_per_input=PAIR_TEXTS)
    result = await front.core.classify(
        model,
        inputs,
        pairs=fields.strings("pairs", required=False) or None,
        truncate=truncate,
        truncation_strategy=fields.string("truncation_strategy") or "longest_first",
        top_k=fields.integer("top_k"),
        raw_scores=fields.boolean("raw_scores"),
        deadline=call.deadline,
    )
    labels = sum(len(row) for row in result.labels)
    return await off_loop_above(front, JSON_ENTRY_BYTES * labels, _classify_reply, result)


def _rerank_reply(result: RerankResult) -> Response:
    results = []
    for r in result.results:
        entry = {"index": r.index, "score": float(r.score), "truncated": r.truncated}
        if r.document is not None:
            entry["document"] = r.document
        results.append(entry)
    return json_response(
        200, {"results": results, "method": result.method, "metadata": metadata(result.meta)}
    )


async def rerank(front: HttpFront, call: Call) -> Response:
    body = await json_object(front, call.request, PAIR_TEXTS)
    allowed = ("query", "documents", "model", "top_n", "return_documents", "raw_scores", "truncate")
    fields = Fields(body, allowed)
    query, docs = fields.required_string("query"), documents(front, body, "documents", objects=False)
    result = await front.core.rerank(
        fields.string("model"),
        query,
        docs,
        top_n=top_n(fields),
        return_documents=fields.boolean("return_documents"),
        raw_scores=fields.boolean("raw_scores"),
        truncate=fields.boolean("truncate", True),
        deadline=call.deadline,
    )
    size = sum(JSON_ENTRY_BYTES + 6 * len(r.document or "") for r in result.results)
    return await off_loop_above(front, size, _rerank_reply, result)


def _score_reply(result: ScoreResult) -> Response:
    results = [
        {"score": score, "truncated": truncated}
        for score, truncated in zip(result.scores.tolist(), result.truncated, strict=True)
    ]
    return json_response(
        200, {"results": results, "method": result.method, "metadata": metadata(result.meta)}
    )


async def score(front: HttpFront, call: Call) -> Response:
    body = await json_object(front, call.request, PAIR_TEXTS)
    allowed = ("texts_1", "texts_2", "model", "raw_scores", "truncate", "truncation_strategy")
    fields = Fields(body, allowed)
    result = await front.core.score(
        fields.string("model"),
        fields.strings("texts_1"),
        fields.strings("texts_2"),
        raw_scores=fields.boolean("raw_scores"),
        truncate=fields.boolean("truncate"),
        truncation_strategy=fields.string("truncation_strategy") or "longest_first",
        deadline=call.deadline,
    )
    return await off_loop_above(front, JSON_ENTRY_BYTES * len(result.scores), _score_reply, result)


def _tokenize_reply(result: TokenizeResult) -> Response:
    results = [{"tokens": tokens(e)} for e in result.inputs]
    return json_response(200, {"results": results, "metadata": metadata(result.meta)})


async def tokenize(front: HttpFront, call: Call) -> Response:
    _, inputs, model, truncate = await _request(front, call)
    result = await front.core.tokenize(model, inputs, truncate=truncate)
    size = JSON_ENTRY_BYTES * result.meta.total_tokens
    return await off_loop_above(front, size, _tokenize_reply, result)


def _attention_reply(result: AttentionResult) -> Response:
    maps = [
        {"layer": layer, "head": head, "probabilities": result.maps[i, j].ravel().tolist()}
        for i, layer in enumerate(result.layers)
        for j, head in enumerate(result.heads)
    ]
    body = {
        "tokens": tokens(result.tokens),
        "sequence_length": result.tokens.length,
        "num_layers": result.num_layers,
        "num_heads": result.num_heads,
        "maps": maps,
        "metadata": metadata(result.meta),
    }
    return json_response(200, body)


async def attention(front: HttpFront, call: Call) -> Response:
    body = await json_object(front, call.request)
    fields = Fields(body, ("input", "model", "layers", "heads", "truncate"))
    model = fields.string("model")
    dims = front.core.registry.resolve_attention(model).manifest.dimensions
    result = await front.core.attention(
        model,
        fields.required_string("input"),
        layers=fields.integers("layers", dims.num_hidden_layers),
        heads=fields.integers("heads", dims.num_attention_heads),
        truncate=fields.boolean("truncate"),
        deadline=call.deadline,
        reply_bytes=(JSON_PROBABILITY_BYTES, JSON_TOKEN_BYTES),
    )
    size = JSON_PROBABILITY_BYTES * result.maps.size
    return await off_loop_above(front, size, _attention_reply, result)


async def info(front: HttpFront, call: Call) -> Response:
    if call.request.method == "POST" and call.request.body:
        Fields(await json_object(front, call.request), ())
    server = front.core.info()
    models = [asdict(m) for m in server.models]
    return json_response(
        200,
        {
            "server_version": server.server_version,
            "models": models,
            "limits": asdict(server.limits),
            "versions": server.versions,
        },
    )


ROUTES = [
    Route("POST", f"{PREFIX}/fill-mask", fill_mask, summary="bertserve.v1 FillMask"),
    Route("POST", f"{PREFIX}/classify", classify, summary="bertserve.v1 Classify"),
    Route("POST", f"{PREFIX}/rerank", rerank, summary="bertserve.v1 Rerank"),
    Route("POST", f"{PREFIX}/score", score, summary="bertserve.v1 Score"),
    Route("POST", f"{PREFIX}/tokenize", tokenize, summary="bertserve.v1 Tokenize"),
    Route("POST", f"{PREFIX}/attention", attention, summary="bertserve.v1 Attention"),
    Route("GET", f"{PREFIX}/info", info, summary="bertserve.v1 Info"),
    Route("POST", f"{PREFIX}/info", info, summary="bertserve.v1 Info"),
]
