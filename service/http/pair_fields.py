"""Request fields shared by the sentence-pair routes (rerank and score, in bertserve's and other servers'
shapes): documents, top_n, the vLLM/Cohere token limits, and core errors renamed to the route's fields."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from bertserve.service.core.validation import check_count
from bertserve.service.errors import InvalidInput
from bertserve.service.http.schema import Fields, kind_of

if TYPE_CHECKING:
    from bertserve.service.http.app import HttpFront

PAIR_TEXTS = 2  # a pair route's body holds two texts per input (see json_body.check_counts)


def documents(front: HttpFront, body: dict, field: str, objects: bool = True) -> list[str]:
    """The documents of `body[field]`: strings, or (with `objects`) {"text": string} objects; refused
    when absent, empty or over max_inputs_per_request (its length is checked before its items)."""
    value = body.get(field)
    kinds = 'strings or {"text": string} objects' if objects else "strings"
    if value is None:
        raise InvalidInput(f"{field}: required (an array of {kinds})")
    if not isinstance(value, list):
        raise InvalidInput(f"{field}: must be an array of {kinds} (got {kind_of(value)})")
    if not value:
        raise InvalidInput(f"{field}: empty; send at least one document")
    check_count(value, front.settings.max_inputs_per_request, field, "document")
    texts = []
    for i, item in enumerate(value):
        if isinstance(item, dict) and objects:
            text = item.get("text")
            if not isinstance(text, str) or len(item) != 1:
                keys = ", ".join(str(k)[:32] for k in itertools.islice(item, 4))
                raise InvalidInput(
                    f'{field}[{i}]: a document object must be {{"text": string}} (keys: {keys})'
                )
            item = text
        elif not isinstance(item, str):
            raise InvalidInput(
                f"{field}[{i}]: must be a string{' or an object' if objects else ''} (got {kind_of(item)})"
            )
        texts.append(item)
    return texts


def texts(front: HttpFront, body: dict, field: str) -> list[str]:
    """A string or a non-empty array of strings (vLLM's text_1 and text_2)."""
    value = body.get(field)
    if value is None:
        raise InvalidInput(f"{field}: required (a string or an array of strings)")
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        shown = "an empty array" if value == [] else kind_of(value)
        raise InvalidInput(f"{field}: must be a string or a non-empty array of strings (got {shown})")
    check_count(value, front.settings.max_inputs_per_request, field, "text")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidInput(f"{field}[{i}]: must be a string (got {kind_of(item)})")
    return value


def top_n(fields: Fields) -> int | None:
    value = fields.integer("top_n")
    if value is not None and value < 1:
        raise InvalidInput(f"top_n: must be at least 1 (got {value}); leave it out for every document")
    return value


def check_token_limit(front: HttpFront, model: str, tokens: int | None, field: str) -> None:
    """A client's own token limit (vLLM's truncate_prompt_tokens, Cohere's max_tokens_per_doc) is taken when
    it cuts nothing that max_length would not: pairs are cut to the answering model's max_length only (and
    a fused cross-encoder's texts to its embedding model's).
    None or -1 (vLLM's "max_length"): nothing to check. `model` "": the default for rerank and score."""
    if tokens is None or tokens == -1:
        return
    registry = front.core.registry
    served, _ = registry.resolve_pairs(model)
    # a fused cross-encoder's embedding model cuts the texts to its own max_length
    partner = registry.fusion_partners.get(served.name)
    for one in (served, partner) if partner is not None else (served,):
        max_length = front.core.model_info(one.name).max_length
        if tokens < max_length:
            raise InvalidInput(
                f"{field}: {tokens} tokens is less than model {one.name}'s max_length {max_length}; bertserve "
                f"cuts pairs to max_length only (leave {field} out, or send at least {max_length})"
            )


@contextmanager
def renamed(names: dict[str, str]) -> Iterator[None]:
    """The core's messages name the bertserve.v1 fields (documents, texts_1...): a route whose fields are
    named otherwise gets them under its own names."""
    try:
        yield
    except InvalidInput as exc:
        text = str(exc)
        for old, new in names.items():
            text = re.sub(rf"\b{re.escape(old)}\b", new, text)
        raise InvalidInput(text) from None
