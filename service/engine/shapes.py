"""Batch shapes on a GPU. ONNX Runtime's CUDA provider runs a new (rows, length) shape slowly the first
time, the fp16 graph's most (docs/performance/gpu-h200), and a server's batches come in endless shapes.
With buckets, a batch is padded up to the smallest bucket holding it, and every bucket is run once before
the server reports serving, so callers meet only shapes the device has seen."""

from __future__ import annotations

from dataclasses import dataclass


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

    def shape(self, rows: int, length: int) -> tuple[int, int]:
        """The bucket of a batch of `rows` inputs, the longest `length` tokens: the smallest bucket of
        each that fits, and the batch's own size or length where a bucket would pass max_tokens."""
        padded_rows = next((r for r in self.rows if r >= rows), rows)
        padded_length = next((n for n in self.lengths if n >= length), length)
        if padded_rows * padded_length <= self.max_tokens:
            return padded_rows, padded_length
        if rows * padded_length <= self.max_tokens:
            return rows, padded_length
        return rows, length

    def all(self) -> list[tuple[int, int]]:
        """Every bucket within max_tokens, what the warm-up runs."""
        return [(r, n) for n in self.lengths for r in self.rows if r * n <= self.max_tokens]


def buckets(max_batch_size: int, max_batch_tokens: int, max_length: int) -> ShapeBuckets:
    return ShapeBuckets(ladder(max_batch_size, 1), ladder(max_length, 8), max_batch_tokens)
