"""Embeddings in text-embeddings-inference's shapes; each route is one `InferenceCore.embed` call.

    POST /embed         {inputs, normalize? (default true), truncate?, truncation_direction? ("Right" | "Left"),
                        prompt_name?, dimensions?, model?} -> [[float]]
    POST /embed_all     {inputs, truncate?, truncation_direction?, prompt_name?, model?} -> [[[float]]]: per
                        input, per token (special tokens included), the last hidden state
    POST /embed_sparse  {inputs, truncate?, truncation_direction?, prompt_name?, model?, sparse_threshold?}
                        -> [[{"index": token id, "value": weight}]]: SPLADE weights above sparse_threshold
                        (default 0), ids ascending

`inputs`: a string, an array of strings, an array of token ids or an array of arrays of them (the model's
own ids, used as given). `model` and `sparse_threshold` are bertserve's: absent, /embed and /embed_all
answer with the default embedding model and /embed_sparse with it when it has an MLM head, else with the
first loaded model that has one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertserve.service.core.task_calls import EmbedCall
from bertserve.service.http import embed_fields
from bertserve.service.http.json_body import JSON_FLOAT_BYTES, off_loop_above
from bertserve.service.http.routing import Call, Route
from bertserve.service.http.schema import Fields
from bertserve.service.http.transport import Response, json_response

if TYPE_CHECKING:
    from bertserve.service.core.results import EmbedResult, ModelInfo
    from bertserve.service.http.app import HttpFront

COMMON = ("inputs", "truncate", "truncation_direction", "prompt_name", "model")
JSON_SPARSE_ENTRY_BYTES = 48  # {"index":30521,"value":1.2345678901234567}, with its comma
NAMES = {"token_ids": "inputs"}  # the core's field names -> TEI's


def _sparse_model(front: HttpFront, name: str) -> ModelInfo:
    """The named model, else the default embedding model when it has an MLM head, else the first loaded
    model with both (none: the default, which the core refuses naming what has one)."""
    model = embed_fields.embed_model(front, name)
    if name or model.sparse:
        return model
    infos = front.core.info().models
    found = next((m.name for m in infos if m.sparse and "embed" in m.tasks), None)
    return embed_fields.embed_model(front, found) if found else model


async def _embed(front: HttpFront, call: Call, extra: tuple[str, ...], options: dict) -> tuple:
    body = await embed_fields.embed_body(front, call.request)
    fields = Fields(body, (*COMMON, *extra))
    texts, token_ids = embed_fields.texts_or_ids(front, body.get("inputs"), "inputs")
    direction = embed_fields.direction(fields)
    prompt_name = fields.string("prompt_name") or None
    truncate = fields.boolean("truncate")
    if options.get("sparse"):
        model = _sparse_model(front, fields.string("model"))
        options["sparse_threshold"] = embed_fields.number(fields, "sparse_threshold", 0.0)
    else:
        model = embed_fields.embed_model(front, fields.string("model"))
    if "dimensions" in extra:
        options["dimensions"] = embed_fields.dimensions(fields)
        options["normalize"] = fields.boolean("normalize", True)
    with embed_fields.field_names(NAMES):
        if options.get("tokens"):
            await embed_fields.check_tokens_reply(front, model, texts, token_ids, prompt_name)
        result = await front.core.embed(
            model.name,
            texts,
            truncate=truncate,
            deadline=call.deadline,
            call=EmbedCall(**options),
            prompt_name=prompt_name,
            truncation_direction=direction,
            token_ids=token_ids,
        )
    return result


def _dense_reply(result: EmbedResult) -> Response:
    return json_response(200, result.vectors)


async def embed(front: HttpFront, call: Call) -> Response:
    result = await _embed(front, call, ("normalize", "dimensions"), {})
    return await off_loop_above(front, JSON_FLOAT_BYTES * result.vectors.size, _dense_reply, result)


def _tokens_reply(result: EmbedResult) -> Response:
    return json_response(200, [rows.tolist() for rows in result.tokens])


async def embed_all(front: HttpFront, call: Call) -> Response:
    result = await _embed(front, call, (), {"dense": False, "tokens": True})
    size = JSON_FLOAT_BYTES * sum(rows.size for rows in result.tokens)
    return await off_loop_above(front, size, _tokens_reply, result)


def _sparse_reply(result: EmbedResult) -> Response:
    body = [
        [{"index": i, "value": w} for i, w in zip(ids.tolist(), weights.tolist(), strict=True)]
        for ids, weights in result.sparse
    ]
    return json_response(200, body)


async def embed_sparse(front: HttpFront, call: Call) -> Response:
    result = await _embed(front, call, ("sparse_threshold",), {"dense": False, "sparse": True})
    entries = sum(len(ids) for ids, _ in result.sparse)
    embed_fields.check_sparse_reply(front, entries, JSON_SPARSE_ENTRY_BYTES)
    return await off_loop_above(front, JSON_SPARSE_ENTRY_BYTES * entries, _sparse_reply, result)


ROUTES = [
    Route("POST", "/embed", embed, summary="Embeddings (text-embeddings-inference's shape)"),
    Route("POST", "/embed_all", embed_all, summary="Token-level embeddings (TEI's /embed_all)"),
    Route("POST", "/embed_sparse", embed_sparse, summary="Sparse SPLADE embeddings (TEI's /embed_sparse)"),
]
