"""OpenAI-compatible embeddings (`POST /v1/embeddings`) and model list (`GET /v1/models`,
`GET /v1/models/{model}`), for the `openai` client, LangChain's OpenAIEmbeddings, LlamaIndex and curl.

Request fields: `input` (a string or an array of strings; token-id arrays are refused: send text),
`model` (a served model; absent: the default embedding model; unknown: 404), `encoding_format` ("float"
or "base64": little-endian float32, as the openai client decodes it), `dimensions` (accepted only when it
equals the model's dimension: the served models cannot shorten their embeddings), `user` (ignored), and
bertserve's `truncate` (cut inputs longer than the model's max_length instead of refusing them; the
openai client sends it with `extra_body={"truncate": True}`).
`usage.prompt_tokens` = `usage.total_tokens` = the tokens the model read, special tokens included.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import numpy as np

from bertserve.service.core.results import EmbedResult
from bertserve.service.engine.tasks import Task
from bertserve.service.errors import InvalidInput
from bertserve.service.http.json_body import JSON_FLOAT_BYTES, off_loop_above
from bertserve.service.http.routing import Call, Route
from bertserve.service.http.schema import Fields, json_object, kind_of
from bertserve.service.http.transport import Response, json_response

if TYPE_CHECKING:
    from bertserve.service.http.app import HttpFront

FIELDS = ("input", "model", "encoding_format", "dimensions", "user", "truncate")
OWNER = "bertserve"
BASE64_FLOAT_BYTES = 6  # a float32 in base64, rounded up


def read_input(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        shown = "an empty array" if value == [] else kind_of(value)
        raise InvalidInput(f"input: must be a string or a non-empty array of strings (got {shown})")
    for i, item in enumerate(value):
        if isinstance(item, int | list) and not isinstance(item, bool):
            raise InvalidInput(
                f"input[{i}]: token-id arrays are not supported; send the text (a string or an array of strings)"
            )
        if not isinstance(item, str):
            raise InvalidInput(f"input[{i}]: must be a string (got {kind_of(item)})")
    return value


def _as_openai_error(exc: InvalidInput) -> InvalidInput:
    """The core's messages name `inputs[i]`; this API's field is `input`."""
    text = str(exc)
    return InvalidInput("input" + text[len("inputs") :]) if text.startswith("inputs") else exc


def _encode(vectors: np.ndarray, encoding: str) -> list:
    if encoding == "float":
        return vectors.tolist()
    little = np.ascontiguousarray(vectors, dtype="<f4")
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in little]


async def embeddings(front: HttpFront, call: Call) -> Response:
    body = await json_object(front, call.request)
    fields = Fields(body, FIELDS)
    if "input" not in body or body["input"] is None:
        raise InvalidInput("input: required (a string or an array of strings)")
    texts = read_input(body["input"])
    name = fields.string("model")
    encoding = fields.choice("encoding_format", ("float", "base64"), "float")
    dimensions = fields.integer("dimensions")
    truncate = fields.boolean("truncate")
    model = front.core.registry.resolve(name, Task.EMBED)
    dimension = model.manifest.tasks.embed.dimension
    if dimensions is not None and dimensions != dimension:
        raise InvalidInput(
            f"dimensions: model {model.name} makes {dimension}-dimensional embeddings and cannot shorten "
            f"them; leave dimensions out or send {dimension}"
        )
    try:
        result = await front.core.embed(model.name, texts, truncate=truncate, deadline=call.deadline)
    except InvalidInput as exc:
        raise _as_openai_error(exc) from None
    size = (JSON_FLOAT_BYTES if encoding == "float" else BASE64_FLOAT_BYTES) * result.vectors.size
    return await off_loop_above(front, size, _reply, result, encoding)


def _reply(result: EmbedResult, encoding: str) -> Response:
    data = [
        {"object": "embedding", "index": i, "embedding": vector}
        for i, vector in enumerate(_encode(result.vectors, encoding))
    ]
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
