"""A batch's encoder feeds (input_ids, attention_mask, token_type_ids), built on the batch's worker thread
from bytes alone: numpy lets go of the GIL in whole-array fills and zeroed allocations, and each time the
worker then waits for the engine's busy event loop to hand it back (docs/performance/engine-per-input)."""

from __future__ import annotations

import numpy as np

_ONE, _ZERO = np.int64(1).tobytes(), np.int64(0).tobytes()
INT64 = np.dtype(np.int64)


def _raw(tokens: np.ndarray) -> bytes:
    return (tokens if tokens.dtype == INT64 else tokens.astype(INT64)).tobytes()


def batch_feeds(batch: list, shape: tuple[int, int], pad_id: int) -> dict[str, np.ndarray]:
    """The feeds of `batch`'s WorkItems padded to `shape` (rows, length): a row's ids then pad ids, its mask
    1 over its tokens, its type ids then 0. Rows past the batch (a shape bucket's spare rows) hold pad ids
    and attend to their first token only (no empty softmax)."""
    rows, length = shape
    pad = np.int64(pad_id).tobytes()
    ids, mask, types = [], [], []
    for item in batch:
        rest = length - item.length
        ids += (_raw(item.ids), pad * rest)
        mask += (_ONE * item.length, _ZERO * rest)
        types += (_raw(item.type_ids), _ZERO * rest)
    if spare := rows - len(batch):
        ids.append(pad * (length * spare))
        mask.append((_ONE + _ZERO * (length - 1)) * spare)
        types.append(_ZERO * (length * spare))

    def matrix(parts: list[bytes]) -> np.ndarray:  # read-only: a view of the joined bytes
        return np.frombuffer(b"".join(parts), INT64).reshape(shape)

    return {"input_ids": matrix(ids), "attention_mask": matrix(mask), "token_type_ids": matrix(types)}
