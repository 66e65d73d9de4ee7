"""Embeddings in Cohere v2's shape (the `cohere` SDK's ClientV2.embed); one `InferenceCore.embed` call.

    POST /v2/embed  {texts, model?, input_type?, embedding_types? (["float", "int8", "uint8", "binary",
                    "ubinary", "base64"]; default ["float"]), truncate? ("NONE" | "START" | "END", default END),
                    output_dimension?, max_tokens? (at least the model's max_length), priority? (ignored)}
                    -> {id, embeddings: {float?, int8?, uint8?, binary?, ubinary?, base64?}, texts, meta:
                    {api_version, billed_units: {input_tokens}}, response_type: "embeddings_by_type"}

`input_type` selects the model's prompt (service/core/prompts.py: the prompt of that name, else
search_query -> "query" and search_document -> "document" or "passage"); a model without prompts ignores
it. truncate START cuts an input's start (the left side), END its end, NONE refuses inputs over max_length.
int8 and uint8 use the model's calibration ranges; binary and ubinary are packed bits; base64 is each float
vector's little-endian float32 bytes. `images` and `inputs` (image and mixed content) are refused.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from bertserve.service.core.prompts import cohere_prompt_name
from bertserve.service.core.task_calls import ENCODINGS, EmbedCall
from bertserve.service.errors import InvalidInput
from bertserve.service.http import embed_fields
from bertserve.service.http.json_body import JSON_FLOAT_BYTES, off_loop_above
from bertserve.service.http.routing import Call, Route
from bertserve.service.http.schema import Fields, json_object
from bertserve.service.http.transport import Response, json_response

if TYPE_CHECKING:
    from bertserve.service.core.results import EmbedResult
    from bertserve.service.http.app import HttpFront

FIELDS = (
    "texts",
    "model",
    "input_type",
    "embedding_types",
    "truncate",
    "output_dimension",
    "max_tokens",
    "priority",
    "images",
    "inputs",
)
TYPES = (*(e for e in ENCODINGS if e != "float16"), "base64")
TRUNCATE = {"NONE": (False, "right"), "START": (True, "left"), "END": (True, "right")}
NAMES = {"inputs": "texts", "dimensions": "output_dimension", "encodings": "embedding_types"}


def _reply(result: EmbedResult, types: tuple[str, ...], texts: list[str]) -> Response:
    embeddings: dict[str, object] = {}  # arrays or base64 strings
    for name in types:
        if name == "float":
            embeddings["float"] = result.vectors
        elif name == "base64":
            embeddings["base64"] = embed_fields.float32_base64(result.vectors)
        else:
            embeddings[name] = result.encodings[name]
    body = {
        "id": str(uuid.uuid4()),
        "embeddings": embeddings,
        "texts": texts,
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": result.meta.total_tokens}},
        "response_type": "embeddings_by_type",
    }
    return json_response(200, body)


async def embed_v2(front: HttpFront, call: Call) -> Response:
    body = await json_object(front, call.request)
    fields = Fields(body, FIELDS)
    for name in ("images", "inputs"):
        if body.get(name) is not None:
            raise InvalidInput(f"{name}: images and mixed inputs are not supported; send texts")
    texts = fields.strings("texts")
    if not texts:
        raise InvalidInput("texts: empty; send at least one text")
    model = embed_fields.embed_model(front, fields.string("model"))
    input_type = fields.string("input_type")
    prompt_name = cohere_prompt_name(input_type, model.prompts)
    types = embed_fields.encodings(fields, "embedding_types", TYPES)
    truncate, direction = TRUNCATE[fields.choice("truncate", tuple(TRUNCATE), "END")]
    fields.integer("priority")  # Cohere's scheduling hint: accepted, not used
    max_tokens = fields.integer("max_tokens")
    if max_tokens is not None and max_tokens < model.max_length:
        raise InvalidInput(
            f"max_tokens: {max_tokens} tokens is less than model {model.name}'s max_length {model.max_length}; "
            f"bertserve cuts inputs to max_length only (leave max_tokens out, or send at least {model.max_length})"
        )
    encodings = tuple(dict.fromkeys("float" if t == "base64" else t for t in types))
    options = EmbedCall(dimensions=embed_fields.dimensions(fields, "output_dimension"), encodings=encodings)
    with embed_fields.field_names(NAMES):
        result = await front.core.embed(
            model.name,
            texts,
            truncate=truncate,
            deadline=call.deadline,
            call=options,
            prompt_name=prompt_name,
            truncation_direction=direction,
        )
    size = JSON_FLOAT_BYTES * result.vectors.size * len(types) if result.vectors is not None else 0
    size += sum(len(text) for text in texts)  # the texts are echoed back
    return await off_loop_above(front, size, _reply, result, types, texts)


ROUTES = [Route("POST", "/v2/embed", embed_v2, summary="Embeddings (Cohere v2's shape)")]
