"""Embedding request fields shared by the embedding routes (bertserve.v1 JSON, TEI, OpenAI, Cohere):
inputs as texts or the model's token ids, the EmbedOptions fields, and the bound on a token-level
answer's JSON checked before the encoder runs."""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from bertserve.service.core.task_calls import (
    CHUNK_POOLINGS,
    ENCODINGS,
    TRUNCATION_DIRECTIONS,
    Chunking,
    EmbedCall,
)
from bertserve.service.core.validation import check_count
from bertserve.service.engine.tasks import Task
from bertserve.service.errors import InvalidInput
from bertserve.service.http.json_body import JSON_FLOAT_BYTES
from bertserve.service.http.schema import Fields, json_object, kind_of

if TYPE_CHECKING:
    from bertserve.service.core.results import ModelInfo
    from bertserve.service.http.app import HttpFront
    from bertserve.service.http.transport import Request

MAX_TOKEN_ID = (1 << 32) - 1  # token ids are uint32 in the proto
OPTION_FIELDS = (
    "dimensions",
    "prompt_name",
    "truncation_direction",
    "encodings",
    "dense",
    "tokens",
    "sparse",
    "sparse_threshold",
    "chunking",
)


async def embed_body(front: HttpFront, request: Request) -> dict:
    """The body of a route that takes token ids: an input may be max_length ids (of the longest model), so
    the parser's count of JSON values allows that many per input."""
    per_input = max(m.manifest.max_length for m in front.core.registry.ordered)
    return await json_object(front, request, values_per_input=per_input)


def token_id_lists(front: HttpFront, value: object, field: str) -> list[list[int]]:
    """A non-empty array of non-empty arrays of token ids (each an integer 0 <= id < 2**32)."""
    if not isinstance(value, list) or not value:
        shown = "an empty array" if value == [] else kind_of(value)
        raise InvalidInput(f"{field}: must be a non-empty array of arrays of token ids (got {shown})")
    check_count(value, front.settings.max_inputs_per_request, field, "input")
    for i, ids in enumerate(value):
        if not isinstance(ids, list):
            raise InvalidInput(f"{field}[{i}]: must be an array of token ids (got {kind_of(ids)})")
        check_ids(ids, f"{field}[{i}]")
    return value


def check_ids(ids: list, field: str) -> None:
    for j, item in enumerate(ids):
        if not isinstance(item, int) or isinstance(item, bool) or not 0 <= item <= MAX_TOKEN_ID:
            shown = repr(item)[:32] if isinstance(item, int | float) else kind_of(item)
            raise InvalidInput(
                f"{field}[{j}]: must be a token id, an integer from 0 to {MAX_TOKEN_ID} (got {shown})"
            )


def texts_or_ids(front: HttpFront, value: object, field: str) -> tuple[list[str], list[list[int]] | None]:
    """TEI's `inputs` and OpenAI's `input`: a string, an array of strings, an array of token ids (one
    input) or an array of arrays of token ids. Returns (texts, None) or ([], token ids)."""
    if value is None:
        raise InvalidInput(f"{field}: required (a string, an array of strings or of token ids)")
    if isinstance(value, str):
        return [value], None
    if not isinstance(value, list) or not value:
        shown = "an empty array" if value == [] else kind_of(value)
        raise InvalidInput(
            f"{field}: must be a string or a non-empty array of strings or token ids (got {shown})"
        )
    first = value[0]
    if isinstance(first, list):
        return [], token_id_lists(front, value, field)
    if isinstance(first, int) and not isinstance(first, bool):
        check_ids(value, field)
        return [], [value]
    check_count(value, front.settings.max_inputs_per_request, field, "input")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidInput(f"{field}[{i}]: must be a string, as {field}[0] is (got {kind_of(item)})")
    return value, None


def direction(fields: Fields, name: str = "truncation_direction") -> str:
    """ "right" or "left", case-insensitive (TEI sends "Right" and "Left")."""
    value = fields.string(name, "right")
    if value.lower() not in TRUNCATION_DIRECTIONS:
        raise InvalidInput(
            f"{fields.prefix}{name}: must be one of {', '.join(TRUNCATION_DIRECTIONS)} (got {value[:32]!r})"
        )
    return value.lower()


def dimensions(fields: Fields, name: str = "dimensions") -> int | None:
    value = fields.integer(name)
    if value is not None and value < 1:
        raise InvalidInput(f"{name}: must be at least 1 (got {value}); leave it out for the full vector")
    return value


def number(fields: Fields, name: str, default: float) -> float:
    value = fields.body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{fields.prefix}{name}: must be a number (got {kind_of(value)})")
    return float(value)


def encodings(
    fields: Fields, name: str = "encodings", choices: tuple[str, ...] = ENCODINGS
) -> tuple[str, ...]:
    value = fields.body.get(name)
    if value is None:
        return ("float",)
    if not isinstance(value, list) or not value:
        shown = "an empty array" if value == [] else kind_of(value)
        raise InvalidInput(f"{name}: must be a non-empty array of {', '.join(choices)} (got {shown})")
    if len(value) > len(choices):
        raise InvalidInput(f"{name}: {len(value)} items; each of {', '.join(choices)} at most once")
    for i, item in enumerate(value):
        if item not in choices:
            shown = repr(item)[:32] if isinstance(item, str) else kind_of(item)
            raise InvalidInput(f"{name}[{i}]: must be one of {', '.join(choices)} (got {shown})")
    if len(set(value)) != len(value):
        raise InvalidInput(f"{name}: each encoding at most once (got {', '.join(value)})")
    return tuple(value)


def chunking(body: dict) -> Chunking | None:
    value = body.get("chunking")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidInput(
            f"chunking: must be an object {{length?, overlap?, pooling?}} (got {kind_of(value)})"
        )
    fields = Fields(value, ("length", "overlap", "pooling"), prefix="chunking.")
    length, overlap = fields.integer("length", 0), fields.integer("overlap", 0)
    for name, got in (("length", length), ("overlap", overlap)):
        if got < 0:
            raise InvalidInput(f"chunking.{name}: must be at least 0 (got {got})")
    return Chunking(length, overlap, fields.choice("pooling", CHUNK_POOLINGS, "mean"))


def embed_call(fields: Fields, normalize: bool | None) -> EmbedCall:
    """The bertserve.v1 EmbedOptions fields (and normalize) as the core's EmbedCall. `dense` absent: the
    pooled vector unless `tokens` or `sparse` is asked (as the proto's)."""
    tokens, sparse = fields.boolean("tokens"), fields.boolean("sparse")
    dense = fields.boolean("dense", None)
    return EmbedCall(
        normalize=normalize,
        dimensions=dimensions(fields),
        dense=not (tokens or sparse) if dense is None else dense,
        tokens=tokens,
        sparse=sparse,
        sparse_threshold=number(fields, "sparse_threshold", 0.0),
        encodings=encodings(fields),
    )


@contextmanager
def field_names(names: dict[str, str]) -> Iterator[None]:
    """The core names the bertserve.v1 fields (`token_ids[2][5]: ...`, `options.dimensions: ...`): a route
    whose fields are named otherwise gets the message under its own name (the leading field only)."""
    try:
        yield
    except InvalidInput as exc:
        text = str(exc)
        head = re.match(r"[\w.]+", text)
        if head is not None:
            field = head[0].removeprefix("options.")
            text = names.get(field, field) + text[head.end() :]
        raise InvalidInput(text) from None


def float32_base64(vectors: np.ndarray) -> list[str]:
    """Each row as base64 of its little-endian float32 bytes (OpenAI's and Cohere's base64)."""
    little = np.ascontiguousarray(vectors, dtype="<f4")
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in little]


def embed_model(front: HttpFront, name: str) -> ModelInfo:
    """The named model (it must have an embed task), or the default embedding model."""
    return front.core.model_info(front.core.registry.resolve(name, Task.EMBED).name)


async def check_tokens_reply(
    front: HttpFront,
    model: ModelInfo,
    texts: list[str],
    token_ids: list[list[int]] | None,
    prompt_name: str | None,
) -> None:
    """Refuses, before the encoder runs, a token-level answer whose JSON (about JSON_FLOAT_BYTES a value)
    would pass max_message_bytes: the tokens are counted by the model's tokenizer (cut at max_length),
    the prompt's tokens added."""
    max_length = model.max_length
    if token_ids is not None:
        counts = [min(len(ids), max_length) for ids in token_ids]
    else:
        counted = await front.core.tokenize(model.name, texts, truncate=True)
        extra = 0
        prompt = model.prompts.get(prompt_name or model.default_prompt_name)
        if prompt:  # the prompt's own tokens, without the special tokens it was wrapped in
            (encoded,) = (await front.core.tokenize(model.name, [prompt])).inputs
            extra = encoded.length - sum(encoded.special)
        counts = [min(e.length + extra, max_length) for e in counted.inputs]
    hidden = model.dimension  # the pooled vector's size: the hidden size
    size, limit = JSON_FLOAT_BYTES * hidden * sum(counts), front.settings.max_message_bytes
    if size > limit:
        raise InvalidInput(
            f"tokens: {sum(counts)} tokens x {hidden} values is about {size} bytes of JSON, more than "
            f"max_message_bytes {limit}; send fewer or shorter inputs"
        )


def check_sparse_reply(front: HttpFront, entries: int, entry_bytes: int) -> None:
    """Refuses, after the encoder ran and before its JSON is built, a sparse answer whose JSON (about
    `entry_bytes` an entry) would pass max_message_bytes: the core bounds it in binary (8 bytes an entry),
    JSON takes several times that, and the Python objects behind it more again."""
    size, limit = entries * entry_bytes, front.settings.max_message_bytes
    if size > limit:
        raise InvalidInput(
            f"sparse: {entries} entries is about {size} bytes of JSON, more than max_message_bytes {limit}; "
            "raise sparse_threshold, or send fewer inputs"
        )
