"""How the queue owner cuts a batch from the queued inputs (pure; see `service/engine/batcher.py`), and its
estimates of compute cost: per padded token, and a batch's fixed cost beside it."""

from __future__ import annotations

import statistics
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from itertools import accumulate
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


def cut_by_cost(
    pending: Sequence[HasLength],
    max_size: int,
    max_tokens: int,
    max_padding_ratio: float,
    ladders: tuple[Sequence[int], Sequence[int]],
    shape: Callable[[int, int], tuple[int, int]],
    cost: tuple[float, float],
) -> list[int]:
    """Indices into `pending` (arrival order) of the batch that costs least against what its inputs would
    cost in an ideal batch.

    `cost` is (seconds per batch, seconds per padded token); a batch of r inputs, the longest l tokens, is
    computed at `shape(r, l)`. Its score is its cost over its inputs' cost in a full batch of `max_size`
    without padding (their share of the fixed cost, their real tokens): 1 for an ideal batch. Every input
    is computed once, so the batches nearest the ideal give the most inputs per second. (Cost per real
    token would favour long inputs; overhead per input would pad a few long inputs' batch with many short
    ones.) For each cut length n (the oldest input's, the ladder's steps above it, the longest queued)
    and each count r of `ladders[0]` (and every input that fits), the candidate is the r longest inputs of
    at most n tokens, the oldest always among them; the limits are `cut_batch`'s. Where the fixed cost is
    dear (a GPU's launches), batches stay large; an input far longer than the rest goes with its like.
    """
    fixed, per_token = cost
    order = sorted(range(len(pending)), key=lambda i: (pending[i].length, -i))  # ties: older last
    lengths = [pending[i].length for i in order]
    prefix = list(accumulate(lengths, initial=0))
    first = pending[0].length
    oldest = order.index(0)
    best, chosen = float("inf"), (oldest, oldest + 1, False)
    cuts = sorted({first, lengths[-1]} | {n for n in ladders[1] if first < n < lengths[-1]})
    for n in cuts:
        end = bisect_right(lengths, n)
        counts = {min(r, end, max_size) for r in ladders[0]} | {min(end, max_size)}
        for r in counts:
            start = end - r
            swap = oldest < start  # the shortest of the r gives its place to the oldest
            real = prefix[end] - prefix[start] + (first - lengths[start] if swap else 0)
            longest = first if swap and r == 1 else lengths[end - 1]
            padded = r * longest
            if padded > max_tokens or padded > max_padding_ratio * real:
                continue
            rows, length = shape(r, longest)
            score = (fixed + per_token * rows * length) / (r * fixed / max_size + per_token * real)
            if score < best:
                best, chosen = score, (start, end, swap)
    start, end, swap = chosen
    picked = order[start + swap : end] + ([0] if swap else [])
    return sorted(picked)


class BatchCostFit:
    """A batch's compute seconds as fixed + per_token x padded tokens: a least-squares line through the
    last `window` batches (or the warm-up's replays of every shape bucket: `seed`), fitted again without
    the batches furthest off it. None until `min_points` batches are seen; a window of batches too alike
    to tell the two terms apart keeps the last line."""

    def __init__(self, window: int = 64, min_points: int = 8):
        self._points: deque[tuple[float, float]] = deque(maxlen=window)
        self._min_points = min_points
        self._added = 0
        self.fit: tuple[float, float] | None = None  # (fixed seconds, seconds per padded token)

    def add(self, seconds: float, padded_tokens: int) -> None:
        self._points.append((float(padded_tokens), seconds))
        self._added += 1
        if len(self._points) >= self._min_points and (self._added % 4 == 0 or self.fit is None):
            self._refit(self._points)  # every 4th batch: the line moves slowly, and the loop pays for a refit

    def seed(self, points: Sequence[tuple[int, float]]) -> None:
        """A first line through (padded tokens, seconds) of runs that are not batches (the warm-up's)."""
        self._refit([(float(x), y) for x, y in points])

    def _refit(self, points: Sequence[tuple[float, float]]) -> None:
        line = _least_squares(points)
        if line is None:
            return
        fixed, slope = line  # once more without the batches furthest off it (a stall, a GC pause)
        residuals = sorted(abs(y - fixed - slope * x) for x, y in points)
        cut = residuals[len(points) - 1 - len(points) // TRIMMED]
        line = _least_squares([(x, y) for x, y in points if abs(y - fixed - slope * x) <= cut]) or line
        if line[1] > 0:
            self.fit = (max(0.0, line[0]), line[1])


TRIMMED = 8  # 1 in TRIMMED batches, the furthest off the first line, left out of the second


def _least_squares(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of the least-squares line; None where the x values are too alike to draw one."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points) / n
    if var < (0.1 * mean_x) ** 2:  # one shape over and over: no line to draw
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / n / var
    return mean_y - slope * mean_x, slope
