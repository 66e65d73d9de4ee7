"""Sentence pairs: the tokenizer's truncation strategies, and how `ModelTokenizer.encode_pairs` hands them
two bounded texts (each at most max_length tokens) so that the pair comes out as the whole texts' own.

The strategies are the library's (`Tokenizer.enable_truncation(strategy=...)`, what transformers runs):
longest_first trims the longer text first (two long texts to half the room each, an odd room's extra
token to the longer one); only_first and only_second cut that text alone by what the pair is over.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from bertserve.service.engine.tokenizer_variants import TokenizerVariants
from bertserve.service.errors import InvalidInput, quote

TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")


@dataclass(frozen=True)
class PairNames:
    """How a call's fields are named in `encode_pairs`' refusals; "{i}" is the pair's index."""

    pair: str = "inputs[{i}]"
    first: str = "inputs[{i}]"
    second: str = "pairs[{i}]"


INPUT_PAIRS = PairNames()  # Classify's: inputs[i] with pairs[i]


def check_strategy(strategy: str) -> str:
    if strategy not in TRUNCATION_STRATEGIES:
        raise InvalidInput(
            f"truncation_strategy: {quote(strategy)} is not one of {', '.join(TRUNCATION_STRATEGIES)}"
        )
    return strategy


def pair_tokenizers(path: Path, max_length: int) -> TokenizerVariants:
    """One tokenizer per strategy, made when a call first asks for it: its truncation cuts a pair, its
    post-processor adds the special tokens and segment ids."""

    def configure(tokenizer: Tokenizer, strategy: str) -> None:
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length, strategy=strategy)

    return TokenizerVariants(path, configure)


def _first_tokens(encoding: Encoding, length: int) -> Encoding:
    """A copy of `encoding` cut to its first `length` tokens (the shared original is left alone)."""
    copy = Encoding.merge([encoding], growing_offsets=False)
    copy.truncate(length)
    return copy


def shortened(a: Encoding, b: Encoding, strategy: str, room: int) -> tuple[Encoding, Encoding]:
    """(a, b) for only_first/only_second, the text it cuts pre-cut to one token more than it keeps (`room`:
    max_length less the special tokens). The library splits what it cuts off into pieces the size of what
    it keeps and its post-processor joins the other text to every piece, so a long text cut to a few tokens
    would cost the square of max_length in tokens. The result is the same: what is kept depends on the
    other text alone."""
    cut, other = (b, a) if strategy == "only_second" else (a, b)
    keep = room - len(other.ids)
    if keep < 1 or len(cut.ids) <= keep + 1:
        return a, b  # nothing to spare (or the library refuses the pair)
    cut = _first_tokens(cut, keep + 1)
    return (a, cut) if strategy == "only_second" else (cut, b)


def ordered(a: Encoding, b: Encoding, longer: int) -> tuple[Encoding, Encoding]:
    """(a, b), equally long (max_length tokens, one or both cut from longer texts), for longest_first: it
    cuts both to half an odd room and gives the extra token to the longer text (`longer`: 1 the first, -1
    the second, 0 neither), which these lengths no longer tell. The shorter text is copied one token
    shorter; both keep fewer than that, so the result is the whole texts' own."""
    if longer > 0:
        return a, _first_tokens(b, len(b.ids) - 1)
    if longer < 0:
        return _first_tokens(a, len(a.ids) - 1), b
    return a, b


def no_room(names: PairNames, i: int, strategy: str, kept_tokens: int, max_length: int, specials: int) -> str:
    """The refusal of a pair whose text kept whole (the first for only_second) leaves no room for the other."""
    kept, cut = (names.first, names.second) if strategy == "only_second" else (names.second, names.first)
    kept, cut = kept.format(i=i), cut.format(i=i)
    return (
        f"{kept}: {kept_tokens} tokens leave no room for {cut} within max_length {max_length} ({specials} "
        f"special tokens included); truncation_strategy {strategy} cuts only {cut}"
    )
