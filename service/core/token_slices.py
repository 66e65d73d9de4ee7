"""One call's (or one group's) texts tokenized in slices on several threads at once.

The tokenizers library releases the GIL while it encodes, so contiguous slices of the texts, cut to hold
about the same characters, tokenize in parallel: a bulk request's tokenization (most of its time in a
front before its batch) takes a fraction of its time where cores are free. The calling thread encodes the
first slice and then every slice no pool thread has started (cancelled there), then waits for those that
started, so it never waits on a pool busy with other work. Each slice is cut at max_length; a call that
did not ask to truncate is then refused as `ModelTokenizer.encode` refuses it (the first cut input, by its
index in the whole call).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from concurrent.futures import Executor, Future

from bertserve.service.engine.tokenization import EncodedInput, ModelTokenizer

# A slice's least characters: a hop to another thread costs about as much as tokenizing a few dozen.
MIN_SLICE_CHARS = 1024


def slice_bounds(lengths: Sequence[int], slices: int) -> list[int]:
    """Where `slices` contiguous slices of texts with these lengths begin and end (first 0, last len):
    each slice about the same characters, none empty."""
    ends = list(itertools.accumulate(lengths))
    total = ends[-1] if ends else 0
    bounds = [0]
    for k in range(1, slices):
        target = total * k / slices
        i = bisect.bisect_left(ends, target)  # the text that crosses the target: this slice's or the next's
        cut = i + 1 if ends[i] - target <= target - (ends[i - 1] if i else 0) else i
        bounds.append(min(max(cut, bounds[-1] + 1), len(lengths) - (slices - k)))
    return [*bounds, len(lengths)]


def encode_sliced(
    tokenizer: ModelTokenizer,
    texts: list[str],
    truncate: bool,
    detailed: bool,
    left: bool,
    pool: Executor | None,
    threads: int,
) -> list[EncodedInput]:
    """Blocking: `tokenizer.encode(texts, truncate, detailed, left)`, in up to `threads` slices of at least
    MIN_SLICE_CHARS characters, all but the first offered to `pool`."""
    lengths = [len(text) for text in texts]
    slices = min(threads, len(texts), sum(lengths) // MIN_SLICE_CHARS)
    if pool is None or slices < 2:
        return tokenizer.encode(texts, truncate, detailed, left)
    bounds = slice_bounds(lengths, slices)

    def part(k: int) -> list[EncodedInput]:  # cut at max_length; refused below when not truncating
        return tokenizer.encode(texts[bounds[k] : bounds[k + 1]], True, detailed, left and truncate)

    futures = [pool.submit(part, k) for k in range(1, slices)]
    try:  # every slice no pool thread started is encoded here first; then the started ones are awaited
        parts = [part(0), *(part(k) if future.cancel() else future for k, future in enumerate(futures, 1))]
        encoded = [e for p in parts for e in (p.result() if isinstance(p, Future) else p)]
    finally:
        for future in futures:  # a slice failed: the others are not needed
            future.cancel()
    if not truncate:
        tokenizer.refuse_cut(texts, dict(enumerate(encoded)))
    return encoded
