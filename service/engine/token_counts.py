"""Whole-text token counts, taken in pieces of about COUNT_PIECE_CHARS characters cut at word boundaries
(see `word_boundaries`), so a long text never goes to the tokenizer in one call.

`TokenCounts` remembers, for one call, how far each text has been counted: a text shared by many sentence
pairs is tokenized at most once per call. `TokenCounts.compare` says which of two texts has more tokens by
counting both in step, the one behind first, and stops as soon as one has ended and the other has more:
its cost is that of the shorter text, not of both whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from tokenizers import Encoding

from bertserve.service.engine.word_boundaries import WordBoundaries

# Characters given to one encode_batch call: bounds the tokenizer's peak memory (its per-character and
# per-token buffers) whatever the request holds.
CHUNK_CHARS = 1 << 17
COUNT_PIECE_CHARS = 4096


def chunks(lengths: dict[int, int]) -> Iterator[list[int]]:
    """The keys of `lengths` in order, in groups of at most CHUNK_CHARS characters (at least one each)."""
    chunk: list[int] = []
    total = 0
    for key, length in lengths.items():
        if chunk and total + length > CHUNK_CHARS:
            yield chunk
            chunk, total = [], 0
        chunk.append(key)
        total += length
    if chunk:
        yield chunk


class TokenCounts:
    """Token counts of whole texts (no special tokens) for one call, each piece of a text counted once.

    `count_batch(pieces, add_special_tokens=False)` is the tokenizer's encode_batch (or encode_batch_fast);
    `boundaries` None: the tokenizer's pipeline has no safe cuts, each text is one piece."""

    def __init__(self, count_batch: Callable[..., list[Encoding]], boundaries: WordBoundaries | None):
        self._count_batch = count_batch
        self._boundaries = boundaries
        self._counted: dict[str, tuple[int, int]] = {}  # text -> (tokens so far, characters so far)

    def whole(self, text: str) -> int:
        """The tokens of the whole text."""
        start, ends = self._where(text), []
        while start < len(text):
            start = self._piece_end(text, start)
            ends.append(start)
        self._advance({text: ends})
        return self._counted.get(text, (0, 0))[0]

    def compare(self, a: str, b: str) -> int:
        """1 if text `a` has more tokens than `b`, -1 if fewer, 0 if as many."""
        while True:
            (ta, ca), (tb, cb) = self._counted.get(a, (0, 0)), self._counted.get(b, (0, 0))
            a_done, b_done = ca >= len(a), cb >= len(b)
            if (a_done and b_done) or (a_done and tb > ta) or (b_done and ta > tb):
                return (ta > tb) - (ta < tb)
            # the one behind takes its next piece (both when level); one that has ended stays
            behind = [
                t
                for t, n, done, other in ((a, ta, a_done, tb), (b, tb, b_done, ta))
                if not done and n <= other
            ]
            self._advance({t: [self._piece_end(t, self._where(t))] for t in behind})

    def _where(self, text: str) -> int:
        """The characters of `text` counted so far."""
        return self._counted.get(text, (0, 0))[1]

    def _advance(self, ends: dict[str, list[int]]) -> None:
        """Counts the next pieces of each text, those ending at `ends[text]` (in order), in batches."""
        work = []  # (text, start, end)
        for text, text_ends in ends.items():
            start = self._where(text)
            for end in text_ends:
                work.append((text, start, end))
                start = end
        for chunk in chunks({k: end - start for k, (_, start, end) in enumerate(work)}):
            pieces = [work[k][0][work[k][1] : work[k][2]] for k in chunk]
            for k, encoding in zip(chunk, self._count_batch(pieces, add_special_tokens=False), strict=True):
                text, _, end = work[k]
                self._counted[text] = (self._counted.get(text, (0, 0))[0] + len(encoding.ids), end)

    def _piece_end(self, text: str, start: int) -> int:
        if self._boundaries is None:
            return len(text)
        return self._boundaries.next_cut(text, start + COUNT_PIECE_CHARS)
