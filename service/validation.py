"""Checks on request fields before any work is done; each failure names the field and the limit."""

from __future__ import annotations

import re
from collections.abc import Sequence

from service.errors import InvalidInput

# C0 controls except tab, line feed and carriage return; DEL.
CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def check_texts(inputs: Sequence[str], max_inputs: int, max_chars: int) -> list[str]:
    if not inputs:
        raise InvalidInput("inputs: at least one input is required")
    if len(inputs) > max_inputs:
        raise InvalidInput(f"inputs: {len(inputs)} inputs is more than max_inputs_per_request {max_inputs}")
    texts = list(inputs)
    for i, text in enumerate(texts):
        if len(text) > max_chars:
            raise InvalidInput(
                f"inputs[{i}]: {len(text)} characters is more than max_input_chars {max_chars}"
            )
        if not text.strip():
            raise InvalidInput(f"inputs[{i}]: empty or whitespace-only text")
        if found := CONTROL_CHARACTER.search(text):
            raise InvalidInput(
                f"inputs[{i}]: control character U+{ord(found.group()):04X} at character {found.start()}"
            )
    return texts


def check_top_k(value: int, limit: int, field: str, limit_name: str) -> int:
    if value < 1:
        raise InvalidInput(f"{field}: must be at least 1 (got {value})")
    if value > limit:
        raise InvalidInput(f"{field}: {value} is more than the {limit_name} {limit}")
    return value
