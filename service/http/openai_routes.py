"""OpenAI-compatible embeddings (`POST /v1/embeddings`) and model list (`GET /v1/models`,
`GET /v1/models/{model}`), for the `openai` client, LangChain's OpenAIEmbeddings, LlamaIndex and curl.

Request fields: `input` (a string, an array of strings, an array of token ids or an array of arrays of token
ids: the model's own ids, used as given), `model` (a served model; absent: the default embedding model;
unknown: 404), `encoding_format` ("float" or "base64": little-endian float32, as the openai client decodes
it; the client sends base64 unless told otherwise), `dimensions` (Matryoshka: one of the model's
dimensions, or its full dimension; the vector is cut, then normalized), `user` (ignored), and bertserve's
`truncate` (cut inputs longer than the model's max_length instead of refusing them; the openai client
sends it with `extra_body={"truncate": True}`).
`usage.prompt_tokens` = `usage.total_tokens` = the tokens the model read, special tokens included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertserve.service.core.results import EmbedResult
from bertserve.service.core.task_calls import EmbedCall
from bertserve.service.http import embed_fields
from bertserve.service.http.json_body import JSON_FLOAT_BYTES, off_loop_above
from bertserve.service.http.routing import Call, Route
from bertserve.service.http.schema import Fields
from bertserve.service.http.transport import Response, json_response

if TYPE_CHECKING:
    from bertserve.service.http.app import HttpFront

FIELDS = ("input", "model", "encoding_format", "dimensions", "user", "truncate")
OWNER = "bertserve"
BASE64_FLOAT_BYTES = 6  # a float32 in base64, rounded up
NAMES = {"inputs": "input", "token_ids": "input"}  # the core's field names -> this API's


async def embeddings(front: HttpFront, call: Call) -> Response:
    body = await embed_fields.embed_body(front, call.request)
    fields = Fields(body, FIELDS)
    texts, token_ids = embed_fields.texts_or_ids(front, body.get("input"), "input")
    encoding = fields.choice("encoding_format", ("float", "base64"), "float")
    options = EmbedCall(dimensions=embed_fields.dimensions(fields))
    model = embed_fields.embed_model(front, fields.string("model"))
    with embed_fields.field_names(NAMES):
        result = await front.core.embed(
            model.name,
            texts,
            truncate=fields.boolean("truncate"),
            deadline=call.deadline,
            call=options,
            token_ids=token_ids,
        )
    size = (JSON_FLOAT_BYTES if encoding == "float" else BASE64_FLOAT_BYTES) * result.vectors.size
    return await off_loop_above(front, size, _reply, result, encoding)


def _reply(result: EmbedResult, encoding: str) -> Response:
    vectors = result.vectors if encoding == "float" else embed_fields.float32_base64(result.vectors)
    data = [{"object": "embedding", "index": i, "embedding": vector} for i, vector in enumerate(vectors)]
    tokens = result.meta.total_tokens
    return json_response(
        200,
        {
            "object": "list",
            "data": data,
            "model": result.meta.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
    )


def _model_entry(front: HttpFront, name: str) -> dict:
    return {"id": name, "object": "model", "created": front.started_at, "owned_by": OWNER}


async def list_models(front: HttpFront, call: Call) -> Response:
    data = [_model_entry(front, m.name) for m in front.core.registry.ordered]
    return json_response(200, {"object": "list", "data": data})


async def get_model(front: HttpFront, call: Call) -> Response:
    info = front.core.model_info(call.params["model"])  # ModelNotFound: 404
    return json_response(200, _model_entry(front, info.name))


ROUTES = [
    Route("POST", "/v1/embeddings", embeddings, summary="OpenAI-compatible embeddings"),
    Route("GET", "/v1/models", list_models, summary="OpenAI-compatible list of the served models"),
    Route("GET", "/v1/models/{model}", get_model, summary="OpenAI-compatible model entry"),
]
