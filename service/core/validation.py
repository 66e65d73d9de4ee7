"""Checks on request fields before any work is done; each failure names the field and the limit."""

from __future__ import annotations

import re
from collections.abc import Sequence

from bertserve.service.errors import InvalidInput

# C0 controls except tab, line feed and carriage return; DEL.
CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def check_count(inputs: Sequence[str], max_inputs: int, field: str = "inputs", noun: str = "input") -> None:
    """At least one input and at most `max_inputs`: checked before a call takes room in a queue."""
    if not inputs:
        raise InvalidInput(f"{field}: at least one {noun} is required")
    if len(inputs) > max_inputs:
        raise InvalidInput(f"{field}: {len(inputs)} {noun}s is more than max_inputs_per_request {max_inputs}")


def check_pair_count(inputs: Sequence[str], pairs: Sequence[str], fields: tuple[str, str]) -> None:
    """Sentence pairs: as many second texts as first texts."""
    if len(pairs) != len(inputs):
        first, second = fields
        raise InvalidInput(
            f"{second}: {len(pairs)} texts for {len(inputs)} {first}; give one per input (or none)"
        )


def check_text(text: str, name: str, max_chars: int) -> None:
    """One text, named `name` in the refusal: within max_input_chars, not blank, no control characters."""
    if len(text) > max_chars:
        raise InvalidInput(f"{name}: {len(text)} characters is more than max_input_chars {max_chars}")
    if not text.strip():
        raise InvalidInput(f"{name}: empty or whitespace-only text")
    if found := CONTROL_CHARACTER.search(text):
        raise InvalidInput(
            f"{name}: control character U+{ord(found.group()):04X} at character {found.start()}"
        )


def check_texts(inputs: Sequence[str], max_inputs: int, max_chars: int, field: str = "inputs") -> list[str]:
    check_count(inputs, max_inputs, field)
    texts = list(inputs)
    for i, text in enumerate(texts):
        check_text(text, f"{field}[{i}]", max_chars)
    return texts


def check_top_k(value: int, limit: int, field: str, limit_name: str) -> int:
    if value < 1:
        raise InvalidInput(f"{field}: must be at least 1 (got {value})")
    if value > limit:
        raise InvalidInput(f"{field}: {value} is more than the {limit_name} {limit}")
    return value


CANDIDATE_BYTES = 32  # a fill-mask candidate's token, id, score and framing, besides its filled-in text


def check_fill_mask_response_size(
    texts: Sequence[str], masks_per_input: Sequence[int], top_k: int, max_message_bytes: int
) -> None:
    """Refuses, before any compute, a fill-mask call whose answer (the input's text filled in once per
    candidate) would not fit in a gRPC message: without it, top_k up to the vocabulary times many masks
    and inputs makes the server decode millions of sequences for a reply it cannot send."""
    size = sum(
        masks * top_k * (len(text.encode("utf-8")) + CANDIDATE_BYTES)
        for text, masks in zip(texts, masks_per_input, strict=True)
    )
    if size > max_message_bytes:
        raise InvalidInput(
            f"top_k: {top_k} candidates for each of {sum(masks_per_input)} masks need about {size} bytes, "
            f"more than max_message_bytes {max_message_bytes}; lower top_k or send fewer masks"
        )
