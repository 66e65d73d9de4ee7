"""How the queue owner cuts a batch from the queued inputs (pure; see `service/engine/batcher.py`), and its
estimate of compute cost per padded token."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from typing import Protocol


class HasLength(Protocol):
    @property
    def length(self) -> int: ...


def cut_batch(
    pending: Sequence[HasLength], max_size: int, max_tokens: int, max_padding_ratio: float = float("inf")
) -> list[int]:
    """Indices into `pending` (arrival order) of the next batch.

    The oldest input (index 0) is always taken. Then, in length order, the batch grows towards its
    shorter or longer neighbour, whichever adds less padding, while padded length x count stays within
    `max_tokens`, padded tokens within `max_padding_ratio` x real tokens, and the count within
    `max_size`. A single input longer than the budget goes alone.
    """
    order = sorted(range(len(pending)), key=lambda i: (pending[i].length, i))
    lo = hi = order.index(0)
    longest = real = pending[0].length
    count = 1

    def fits(new_longest: int, new_real: int) -> bool:
        padded = new_longest * (count + 1)
        return padded <= max_tokens and padded <= max_padding_ratio * new_real

    while count < max_size:
        best: tuple[int, int, str] | None = None  # (added padding, arrival index, side)
        if lo > 0:
            shorter = pending[order[lo - 1]]
            if fits(longest, real + shorter.length):
                best = (longest - shorter.length, order[lo - 1], "lo")
        if hi + 1 < len(order):
            longer = pending[order[hi + 1]]
            if fits(longer.length, real + longer.length):
                candidate = ((longer.length - longest) * count, order[hi + 1], "hi")
                if best is None or candidate[:2] < best[:2]:
                    best = candidate
        if best is None:
            break
        if best[2] == "lo":
            lo -= 1
        else:
            hi += 1
            longest = pending[order[hi]].length
        real += pending[best[1]].length
        count += 1
    return sorted(order[lo : hi + 1])


class CostEstimate:
    """Seconds of compute per padded token: the median of the last `window` encoder batches.

    A median of recent batches follows the current machine: a slow period (another process, a burst of
    huge batches) leaves it after `window` / 2 normal batches, where a moving average that includes one
    outlier batch stays inflated for long. Attention runs are not batches and are not counted.
    """

    def __init__(self, window: int = 16):
        self._costs: deque[float] = deque(maxlen=window)
        self._median: float | None = None  # of `_costs`: read by every admission, changed once per batch

    def add(self, seconds: float, padded_tokens: int) -> None:
        self._costs.append(seconds / max(1, padded_tokens))
        self._median = statistics.median(self._costs)

    @property
    def seconds_per_token(self) -> float | None:
        return self._median
