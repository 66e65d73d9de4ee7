"""bertserve.v1 Embed over JSON, with every EmbedOptions field (as in protos/bertserve/v1/inference.proto):

    POST /bertserve/v1/embed  {"inputs": [string] | "token_ids": [[id]], "model"?, "normalize"?, "truncate"?,
                               "dimensions"?, "prompt_name"?, "truncation_direction"? ("right" | "left"),
                               "encodings"? (["float", "float16", "int8", "uint8", "binary", "ubinary"]),
                               "dense"?, "tokens"?, "sparse"?, "sparse_threshold"?,
                               "chunking"?: {"length"?, "overlap"?, "pooling"? ("mean" | "max")}}
    -> {"embeddings": [{"values"?, "float16"?, "int8"?, "uint8"?, "binary"?, "ubinary"?, "tokens"?,
                        "sparse"?: {"indices", "values"}, "chunks"?}], "dimension", "metadata"}

Each encoding is an array of numbers (float16 as the half-precision values, the others as the integers of
their bytes: binary and ubinary packed bits); "tokens": one array of hidden-size floats per token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertserve.service.errors import InvalidInput
from bertserve.service.http import embed_fields
from bertserve.service.http.bertserve_routes import PREFIX, metadata
from bertserve.service.http.json_body import JSON_FLOAT_BYTES, off_loop_above
from bertserve.service.http.routing import Call, Route
from bertserve.service.http.schema import Fields
from bertserve.service.http.transport import Response, json_response

if TYPE_CHECKING:
    from bertserve.service.core.results import EmbedResult
    from bertserve.service.core.task_calls import EmbedCall
    from bertserve.service.http.app import HttpFront

# a sparse entry in JSON: an id (up to 6 digits) with its comma, and a weight
SPARSE_JSON_ENTRY_BYTES = 7 + JSON_FLOAT_BYTES
FIELDS = ("inputs", "token_ids", "model", "normalize", "truncate", *embed_fields.OPTION_FIELDS)


def reply_values(result: EmbedResult, call: EmbedCall) -> int:
    """The numbers the reply holds (a sparse entry counts two): to estimate its JSON's size."""
    count = result.vectors.size if result.vectors is not None and "float" in call.encodings else 0
    count += sum(a.size for name, a in result.encodings.items() if name != "float")
    count += sum(t.size for t in result.tokens or ())
    return count + sum(2 * len(ids) for ids, _ in result.sparse or ())


def _entries(result: EmbedResult, call: EmbedCall, count: int) -> list[dict]:
    entries: list[dict] = [{} for _ in range(count)]
    if result.vectors is not None and "float" in call.encodings:
        for entry, row in zip(entries, result.vectors, strict=True):
            entry["values"] = row
    for name, array in result.encodings.items():
        if name != "float":
            for entry, row in zip(entries, array, strict=True):
                entry[name] = row
    for entry, rows in zip(entries, result.tokens or (), strict=False):
        entry["tokens"] = rows.tolist()
    for entry, (ids, weights) in zip(entries, result.sparse or (), strict=False):
        entry["sparse"] = {"indices": ids.tolist(), "values": weights.tolist()}
    for entry, chunks in zip(entries, result.chunks or (), strict=False):
        entry["chunks"] = chunks
    return entries


def _reply(result: EmbedResult, call: EmbedCall, count: int) -> Response:
    body = {
        "embeddings": _entries(result, call, count),
        "dimension": result.dimension,
        "metadata": metadata(result.meta),
    }
    return json_response(200, body)


async def embed(front: HttpFront, call: Call) -> Response:
    body = await embed_fields.embed_body(front, call.request)
    fields = Fields(body, FIELDS)
    texts = fields.strings("inputs", required=False)
    token_ids = None
    if body.get("token_ids") is not None:
        if "inputs" in body:
            raise InvalidInput("token_ids: send either inputs (texts) or token_ids, not both")
        token_ids = embed_fields.token_id_lists(front, body["token_ids"], "token_ids")
    elif not texts:
        raise InvalidInput("inputs: required (an array of strings), or token_ids (an array of arrays of ids)")
    model = embed_fields.embed_model(front, fields.string("model"))
    options = embed_fields.embed_call(fields, fields.boolean("normalize", None))
    prompt_name = fields.string("prompt_name") or None
    direction, chunking = embed_fields.direction(fields), embed_fields.chunking(body)
    if options.tokens:
        await embed_fields.check_tokens_reply(front, model, texts, token_ids, prompt_name)
    with embed_fields.field_names({}):  # the core's "options.dimensions" is this route's "dimensions"
        result = await front.core.embed(
            model.name,
            texts,
            truncate=fields.boolean("truncate"),
            deadline=call.deadline,
            call=options,
            prompt_name=prompt_name,
            truncation_direction=direction,
            token_ids=token_ids,
            chunking=chunking,
        )
    count = len(token_ids) if token_ids is not None else len(texts)
    if result.sparse is not None:
        entries = sum(len(ids) for ids, _ in result.sparse)
        embed_fields.check_sparse_reply(front, entries, SPARSE_JSON_ENTRY_BYTES)
    size = JSON_FLOAT_BYTES * reply_values(result, options)
    return await off_loop_above(front, size, _reply, result, options, count)


ROUTES = [Route("POST", f"{PREFIX}/embed", embed, summary="bertserve.v1 Embed")]
