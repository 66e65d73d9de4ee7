"""Batch shapes on a GPU. ONNX Runtime's CUDA provider runs a new (rows, length) shape slowly the first
time, the fp16 graph's most (docs/performance/gpu-h200), and a server's batches come in endless shapes.
With buckets, a batch is padded up to the smallest bucket holding it, and every bucket is run once before
the server reports serving, so callers meet only shapes the device has seen."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from functools import cached_property


def ladder(top: int, first: int) -> tuple[int, ...]:
    """`first`, then powers of two and the midpoints between them (1.5x), up to `top`, and `top` itself:
    a value is padded by at most half, and the ladder stays short for any `top`."""
    steps, power = [], first
    while power < top:
        steps += [power, power + power // 2] if power >= 2 else [power]
        power *= 2
    return tuple(sorted({s for s in steps if s < top} | {top}))


@dataclass(frozen=True)
class ShapeBuckets:
    rows: tuple[int, ...]  # batch sizes, the largest max_batch_size
    lengths: tuple[int, ...]  # padded lengths, the largest the model's longest input
    max_tokens: int  # max_batch_tokens: no bucket holds more padded tokens

    @cached_property
    def _by_area(self) -> list[tuple[int, int]]:
        """Every bucket, fewest padded tokens first: the ladders' pairs within max_tokens, and for each
        step of either ladder the most of the other that fits with it (batches of long inputs)."""
        pairs = {(r, n) for r in self.rows for n in self.lengths if r * n <= self.max_tokens}
        pairs |= {(min(self.max_tokens // n, self.rows[-1]), n) for n in self.lengths if n <= self.max_tokens}
        pairs |= {(r, min(self.max_tokens // r, self.lengths[-1])) for r in self.rows if r <= self.max_tokens}
        return sorted(pairs, key=lambda pair: (pair[0] * pair[1], pair))

    def shape(self, rows: int, length: int) -> tuple[int, int]:
        """The bucket of a batch of `rows` inputs, the longest `length` tokens: the one with the fewest padded
        tokens that holds it; the batch's own shape where none does (rare: a batch close to max_tokens)."""
        row_steps, length_steps, best = self._table
        r, n = bisect_left(row_steps, rows), bisect_left(length_steps, length)
        found = best[r][n] if r < len(row_steps) and n < len(length_steps) else None
        return (rows, length) if found is None else found

    @cached_property
    def _table(self) -> tuple[list[int], list[int], list[list[tuple[int, int] | None]]]:
        """The buckets' distinct row counts and lengths, and for each pair of them the bucket `shape` gives
        (None: no bucket holds it). A bucket holds (r, n) if it is (r, n) or holds the next step up of
        either, so the table fills from the largest steps down; `shape` then costs two bisections (the
        batcher asks for up to a few hundred shapes per batch it cuts)."""
        row_steps = sorted({r for r, _ in self._by_area})
        length_steps = sorted({n for _, n in self._by_area})
        best: list[list[tuple[int, int] | None]] = [[None] * (len(length_steps) + 1) for _ in row_steps]
        best.append([None] * (len(length_steps) + 1))
        for i in reversed(range(len(row_steps))):
            for j in reversed(range(len(length_steps))):
                here = (row_steps[i], length_steps[j])
                options = [here] if here in self._set else []
                options += [b for b in (best[i + 1][j], best[i][j + 1]) if b is not None]
                best[i][j] = min(options, key=lambda b: (b[0] * b[1], b), default=None)
        return row_steps, length_steps, best

    def holds(self, shape: tuple[int, int]) -> bool:
        """Whether `shape` is a bucket (not a batch too large for every bucket, kept as it came)."""
        return shape in self._set

    @cached_property
    def _set(self) -> frozenset[tuple[int, int]]:
        return frozenset(self._by_area)

    def all(self) -> list[tuple[int, int]]:
        """Every bucket, what the warm-up runs."""
        return list(self._by_area)


def buckets(max_batch_size: int, max_batch_tokens: int, max_length: int) -> ShapeBuckets:
    return ShapeBuckets(ladder(max_batch_size, 1), ladder(max_length, 8), max_batch_tokens)
