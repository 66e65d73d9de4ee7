"""How an embedding call's inputs are prepared besides plain texts: the truncation direction, and token ids
given instead of texts (the model's own ids, used as given: no special tokens added, segment ids 0).

Token ids are checked in two steps: their counts and lengths before the call takes queue room
(`check_token_id_counts`, cheap), their values while they are turned into the graph's inputs
(`encode_token_ids`, on the CPU pool for large calls)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertserve.service.core.task_calls import TRUNCATION_DIRECTIONS
from bertserve.service.engine.tokenization import EncodedInput
from bertserve.service.errors import InvalidInput


def left_truncation(direction: str | None, field: str = "truncation_direction") -> bool:
    """True for "left", False for "right" or empty (case-insensitive: TEI sends "Left"/"Right")."""
    value = (direction or "right").lower()
    if value not in TRUNCATION_DIRECTIONS:
        raise InvalidInput(f"{field}: {direction!r} is not one of {', '.join(TRUNCATION_DIRECTIONS)}")
    return value == "left"


def check_token_id_counts(
    token_ids: Sequence[Sequence[int]], max_inputs: int, max_ids: int, field: str = "token_ids"
) -> None:
    """At least one list and at most `max_inputs` (max_inputs_per_request); each list non-empty and at
    most `max_ids` (max_input_chars) ids long."""
    if len(token_ids) > max_inputs:
        raise InvalidInput(
            f"{field}: {len(token_ids)} lists is more than max_inputs_per_request {max_inputs}"
        )
    for i, ids in enumerate(token_ids):
        if len(ids) == 0:
            raise InvalidInput(f"{field}[{i}]: empty; give at least one token id")
        if len(ids) > max_ids:
            raise InvalidInput(f"{field}[{i}]: {len(ids)} ids is more than max_input_chars {max_ids}")


def encode_token_ids(
    token_ids: Sequence[Sequence[int]],
    vocab_size: int,
    max_length: int,
    truncate: bool,
    left: bool,
    field: str = "token_ids",
) -> list[EncodedInput]:
    """The lists as the graph's inputs. A list over max_length is refused, or (`truncate`) sliced at the
    truncation direction's end; an id kept outside [0, vocab_size) is refused with its place."""
    encoded = []
    for i, given in enumerate(token_ids):
        cut = len(given) > max_length
        if cut and not truncate:
            raise InvalidInput(
                f"{field}[{i}]: {len(given)} ids is more than the model's max_length {max_length} "
                f"(set truncate to cut it)"
            )
        # only the kept ids are read: the work per list is bounded by max_length
        start = len(given) - max_length if cut and left else 0
        kept = given[start : start + max_length] if cut else given
        try:
            ids = np.asarray(kept, dtype=np.int64)
        except (OverflowError, TypeError, ValueError):
            raise InvalidInput(f"{field}[{i}]: token ids must be integers") from None
        if ids.ndim != 1:
            raise InvalidInput(f"{field}[{i}]: a flat list of token ids is required")
        outside = np.flatnonzero((ids < 0) | (ids >= vocab_size))
        if len(outside):
            j = int(outside[0])
            raise InvalidInput(
                f"{field}[{i}][{start + j}]: {int(ids[j])} is outside the vocabulary (size {vocab_size})"
            )
        encoded.append(EncodedInput(ids, np.zeros_like(ids), cut))
    return encoded
