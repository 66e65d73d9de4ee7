"""bertserve.v1 over JSON: one POST route per RPC, with the RPC's fields (snake_case, as in
protos/bertserve/v1/inference.proto), limits and error messages; the answers mirror the proto messages.

    POST /bertserve/v1/embed      {"inputs": [...], "model"?, "normalize"?, "truncate"?}
    POST /bertserve/v1/fill-mask  {"inputs": [...], "model"?, "top_k"?, "truncate"?}
    POST /bertserve/v1/classify   {"inputs": [...], "model"?, "top_k"?, "raw_scores"?, "truncate"?}
    POST /bertserve/v1/tokenize   {"inputs": [...], "model"?, "truncate"?}
    POST /bertserve/v1/attention  {"input": "...", "model"?, "layers"?, "heads"?, "truncate"?}
    GET  /bertserve/v1/info       (POST {} too)
"""

from __future__ import annotations

from dataclasses import asdict

from bertserve.service.http.app import Call, HttpFront, Route
from bertserve.service.http.schema import Fields, json_object
from bertserve.service.http.transport import Response, json_response
from bertserve.service.results import CallMeta
from bertserve.service.tokenization import EncodedInput

PREFIX = "/bertserve/v1"


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


def _request(call: Call, *extra: str) -> tuple[Fields, list[str], str, bool]:
    fields = Fields(json_object(call.request), ("inputs", "model", "truncate", *extra))
    return fields, fields.strings("inputs"), fields.string("model"), fields.boolean("truncate")


async def embed(front: HttpFront, call: Call) -> Response:
    fields, inputs, model, truncate = _request(call, "normalize")
    result = await front.core.embed(
        model, inputs, truncate=truncate, normalize=fields.boolean("normalize", None), deadline=call.deadline
    )
    return json_response(
        200,
        {
            "embeddings": [{"values": row} for row in result.vectors.tolist()],
            "dimension": result.dimension,
            "metadata": metadata(result.meta),
        },
    )


async def fill_mask(front: HttpFront, call: Call) -> Response:
    fields, inputs, model, truncate = _request(call, "top_k")
    result = await front.core.fill_mask(
        model, inputs, truncate=truncate, top_k=fields.integer("top_k"), deadline=call.deadline
    )
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


async def classify(front: HttpFront, call: Call) -> Response:
    fields, inputs, model, truncate = _request(call, "top_k", "raw_scores")
    result = await front.core.classify(
        model,
        inputs,
        truncate=truncate,
        top_k=fields.integer("top_k"),
        raw_scores=fields.boolean("raw_scores"),
        deadline=call.deadline,
    )
    results = [
        {"labels": [{"label": s.label, "index": s.index, "score": float(s.score)} for s in labels]}
        for labels in result.labels
    ]
    return json_response(200, {"results": results, "metadata": metadata(result.meta)})


async def tokenize(front: HttpFront, call: Call) -> Response:
    _, inputs, model, truncate = _request(call)
    result = await front.core.tokenize(model, inputs, truncate=truncate)
    results = [{"tokens": tokens(e)} for e in result.inputs]
    return json_response(200, {"results": results, "metadata": metadata(result.meta)})


async def attention(front: HttpFront, call: Call) -> Response:
    fields = Fields(json_object(call.request), ("input", "model", "layers", "heads", "truncate"))
    result = await front.core.attention(
        fields.string("model"),
        fields.required_string("input"),
        layers=fields.integers("layers"),
        heads=fields.integers("heads"),
        truncate=fields.boolean("truncate"),
        deadline=call.deadline,
    )
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
    return await front.core.off_loop(json_response, 200, body)  # maps can be megabytes of JSON


async def info(front: HttpFront, call: Call) -> Response:
    if call.request.method == "POST" and call.request.body:
        Fields(json_object(call.request), ())
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
    Route("POST", f"{PREFIX}/embed", embed, summary="bertserve.v1 Embed"),
    Route("POST", f"{PREFIX}/fill-mask", fill_mask, summary="bertserve.v1 FillMask"),
    Route("POST", f"{PREFIX}/classify", classify, summary="bertserve.v1 Classify"),
    Route("POST", f"{PREFIX}/tokenize", tokenize, summary="bertserve.v1 Tokenize"),
    Route("POST", f"{PREFIX}/attention", attention, summary="bertserve.v1 Attention"),
    Route("GET", f"{PREFIX}/info", info, summary="bertserve.v1 Info"),
    Route("POST", f"{PREFIX}/info", info, summary="bertserve.v1 Info"),
]
