"""Tokenization with the Rust `tokenizers` library, sized by the manifest's max_length.

`encode` is blocking and meant to run in a worker thread (the library releases the GIL and encodes
a batch in parallel). Inputs longer than max_length are cut when the request says `truncate`, and
refused with the limit named otherwise. Its memory and time per input are bounded by max_length, not by
the length of the text (see `ModelTokenizer.encode`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from bertserve.manifest import TokenizerSpec
from bertserve.service.engine.word_boundaries import WordBoundaries, supports_prefixes
from bertserve.service.errors import InvalidInput, StartupError, quote


@dataclass(frozen=True)
class EncodedInput:
    """One tokenized text. Tokenized for the graph alone (`ModelTokenizer.encode(detailed=False)`: embed,
    classify, fill-mask) it holds only the ids, and refuses to give tokens, offsets or the special mask
    (Tokenize and Attention answers) rather than give wrong ones."""

    ids: np.ndarray  # (T,) int64, special tokens included
    type_ids: np.ndarray  # (T,) int64
    truncated: bool
    # tokens, character offsets into the text, special-token flags; None: tokenized for the graph alone
    details: tuple[list[str], list[tuple[int, int]], list[bool]] | None = field(default=None, repr=False)

    @property
    def length(self) -> int:
        return int(self.ids.shape[0])

    @property
    def detailed(self) -> bool:
        return self.details is not None

    @property
    def tokens(self) -> list[str]:
        return self._details()[0]

    @property
    def offsets(self) -> list[tuple[int, int]]:
        return self._details()[1]

    @property
    def special(self) -> list[bool]:
        return self._details()[2]

    def _details(self) -> tuple[list[str], list[tuple[int, int]], list[bool]]:
        if self.details is None:
            raise ValueError("this input was tokenized for the graph alone (encode with detailed=True)")
        return self.details


# The tokenizer's truncation strategies for a pair too long for max_length (as transformers names them).
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


# The first prefix of a long text: this many characters per token the model can take (English averages
# 4 to 5 characters a token, spaces included, so most texts that fit are tokenized whole at once).
PREFIX_CHARS_PER_TOKEN = 6
# Characters given to one encode_batch call: bounds the tokenizer's peak memory (its per-character and
# per-token buffers) whatever the request holds.
CHUNK_CHARS = 1 << 17
COUNT_PIECE_CHARS = 4096


def _chunks(lengths: dict[int, int]):
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


def _encoded(encoding: Encoding, truncated: bool, detailed: bool) -> EncodedInput:
    ids = np.asarray(encoding.ids, dtype=np.int64)
    type_ids = np.asarray(encoding.type_ids, dtype=np.int64)
    if not detailed:
        return EncodedInput(ids, type_ids, truncated)
    special = [bool(s) for s in encoding.special_tokens_mask]
    return EncodedInput(ids, type_ids, truncated, (encoding.tokens, encoding.offsets, special))


class ModelTokenizer:
    def __init__(self, path: Path, spec: TokenizerSpec, max_length: int):
        try:
            self._whole = Tokenizer.from_file(str(path))
            self._cutting = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises plain Exception for unreadable files
            raise StartupError(f"{path}: cannot read the tokenizer: {exc}") from None
        self._whole.no_truncation()
        self._whole.no_padding()
        self._cutting.no_padding()
        self._cutting.enable_truncation(max_length)
        # pairs: one tokenizer per truncation strategy, its post-processor adds the special tokens and
        # segment ids and its truncation cuts the pair (never reconfigured: tokenization runs on threads)
        self._pairs: dict[str, Tokenizer] = {}
        for strategy in TRUNCATION_STRATEGIES:
            pair = self._pairs[strategy] = Tokenizer.from_file(str(path))
            pair.no_padding()
            pair.enable_truncation(max_length, strategy=strategy)
        self._pair_specials = self._whole.num_special_tokens_to_add(is_pair=True)
        self.spec = spec
        self.max_length = max_length
        self.vocab_size = self._whole.get_vocab_size(with_added_tokens=True)
        added = [t.content for t in self._whole.get_added_tokens_decoder().values()]
        self._boundaries = WordBoundaries(added) if supports_prefixes(self._whole.to_str()) else None
        for token, expected in ((spec.pad_token, spec.pad_token_id), (spec.mask_token, spec.mask_token_id)):
            actual = self._whole.token_to_id(token)
            if actual is not None and actual != expected:
                raise StartupError(f"{path}: token {token} has id {actual}, the manifest says {expected}")

    def encode(self, texts: list[str], truncate: bool, detailed: bool = True) -> list[EncodedInput]:
        """Blocking; run it off the event loop. `detailed` False: for the graph alone, the library skips
        the token strings and character offsets (about 15% less time per text) and only ids are kept.

        The work per input is bounded by what the model can take, not by the text: a long text is
        tokenized as a prefix that ends at a word boundary (see `word_boundaries`), first about
        PREFIX_CHARS_PER_TOKEN x max_length characters, doubled only while it yields no more than
        max_length tokens. Its tokens are exactly the first tokens of the whole text, so the prefix decides
        whether the text is too long and gives the truncated encoding. Texts are tokenized in groups of at
        most CHUNK_CHARS characters, each turned into bounded `EncodedInput`s before the next.
        """
        results: dict[int, EncodedInput] = {}
        first_cut = [len(texts)]

        def keep(i: int, encoding: Encoding, cut: bool) -> None:
            results[i] = _encoded(encoding, cut, detailed)
            if cut:
                first_cut[0] = min(first_cut[0], i)

        # without truncate, only inputs before the first too-long one still matter
        self._prefixes(texts, True, detailed, keep, None if truncate else lambda i: i < first_cut[0])
        refused = sorted(i for i, r in results.items() if r.truncated)
        if refused and not truncate:
            i = refused[0]
            raise InvalidInput(
                f"inputs[{i}]: {self.count_tokens(texts[i])} tokens is more than the model's max_length "
                f"{self.max_length} (set truncate to cut it)"
            )
        return [results[i] for i in range(len(texts))]

    def encode_pairs(
        self,
        firsts: Sequence[str],
        seconds: Sequence[str],
        truncate: bool,
        strategy: str = "longest_first",
        detailed: bool = False,
        names: PairNames = INPUT_PAIRS,
    ) -> list[EncodedInput]:
        """Blocking: each pair (firsts[i], seconds[i]) as the model reads it ([CLS] a [SEP] b [SEP], segment
        ids 0 then 1, as the tokenizer's post-processor writes it). Each text is tokenized without special
        tokens as a bounded prefix of at most max_length tokens (see `encode`; a text shared by several pairs
        once per group), then the tokenizer's own truncation (`strategy`) and post-processor combine the
        two. Without `truncate`, a pair over max_length is refused with its token count."""
        post = self._pairs[check_strategy(strategy)]
        pair = functools.partial(self._pair, post, strategy, truncate, detailed, names)
        results: list[EncodedInput] = []
        for chunk in _chunks({i: len(firsts[i]) + len(seconds[i]) for i in range(len(firsts))}):
            pieces = self._pieces([t for i in chunk for t in (firsts[i], seconds[i])], detailed)
            for i in chunk:
                first, second = firsts[i], seconds[i]
                results.append(pair(i, first, second, pieces[first], pieces[second]))
            del pieces
        return results

    def _pieces(self, texts: list[str], detailed: bool) -> dict[str, tuple[Encoding, bool]]:
        """Each distinct text without special tokens, at most max_length tokens: (encoding, cut)."""
        distinct = list(dict.fromkeys(texts))
        pieces: dict[str, tuple[Encoding, bool]] = {}

        def keep(k: int, encoding: Encoding, cut: bool) -> None:
            pieces[distinct[k]] = (encoding, cut)

        self._prefixes(distinct, False, detailed, keep)
        return pieces

    def _pair(
        self,
        post: Tokenizer,
        strategy: str,
        truncate: bool,
        detailed: bool,
        names: PairNames,
        i: int,
        first: str,
        second: str,
        a_piece: tuple[Encoding, bool],
        b_piece: tuple[Encoding, bool],
    ) -> EncodedInput:
        (a, a_cut), (b, b_cut) = a_piece, b_piece
        cut = a_cut or b_cut or len(a.ids) + len(b.ids) + self._pair_specials > self.max_length
        if cut and not truncate:
            count = self._pair_specials + sum(
                self.count_tokens(text, special=False) if was_cut else len(piece.ids)
                for text, piece, was_cut in ((first, a, a_cut), (second, b, b_cut))
            )
            raise InvalidInput(
                f"{names.pair.format(i=i)}: {count} tokens (pair) is more than the model's max_length "
                f"{self.max_length} (set truncate to cut it)"
            )
        if cut and strategy != "longest_first":
            a, b = self._shortened(a, b, strategy)
        elif cut and len(a.ids) == len(b.ids) and (a_cut or b_cut):
            a, b = self._ordered(first, second, a, a_cut, b, b_cut)
        try:
            encoding = post.post_process(a, b)
        except Exception:  # the library's truncation error: the text kept whole leaves no room
            kept = (first, a, a_cut, names.first, names.second)
            if strategy == "only_first":
                kept = (second, b, b_cut, names.second, names.first)
            text, piece, was_cut, kept_name, cut_name = kept
            count = self.count_tokens(text, special=False) if was_cut else len(piece.ids)
            kept_name, cut_name = kept_name.format(i=i), cut_name.format(i=i)
            raise InvalidInput(
                f"{kept_name}: {count} tokens leave no room for {cut_name} within max_length "
                f"{self.max_length} ({self._pair_specials} special tokens included); truncation_strategy "
                f"{strategy} cuts only {cut_name}"
            ) from None
        return _encoded(encoding, cut, detailed)

    def _shortened(self, a: Encoding, b: Encoding, strategy: str) -> tuple[Encoding, Encoding]:
        """(a, b) with the text that `strategy` cuts copied and pre-cut to one token more than it keeps:
        the library splits what it cuts off into pieces the size of what it keeps, and its post-processor
        joins the other text to every piece, so a long text cut to a few tokens would cost the square of
        max_length in tokens. The result is the same: the kept length depends on the other text alone."""
        cut, other = (b, a) if strategy == "only_second" else (a, b)
        keep = self.max_length - self._pair_specials - len(other.ids)
        if keep < 1 or len(cut.ids) <= keep + 1:
            return a, b  # nothing to spare (or the library refuses the pair)
        copy = Encoding.merge([cut], growing_offsets=False)
        copy.truncate(keep + 1)
        return (a, copy) if strategy == "only_second" else (copy, b)

    def _ordered(
        self, first: str, second: str, a: Encoding, a_cut: bool, b: Encoding, b_cut: bool
    ) -> tuple[Encoding, Encoding]:
        """(a, b) cut to max_length tokens each, equally long, with at least one cut: longest_first then
        cuts both to half, and gives the odd token to the longer text, which these lengths no longer
        tell. The shorter whole text (counted when both were cut) is copied one token shorter; both keep
        fewer than that, so the result is the whole texts' own."""
        la = self.count_tokens(first, special=False) if a_cut else len(a.ids)
        lb = self.count_tokens(second, special=False) if b_cut else len(b.ids)
        if la == lb:
            return a, b
        shorter = Encoding.merge([b if la > lb else a], growing_offsets=False)
        shorter.truncate(len(shorter.ids) - 1)
        return (a, shorter) if la > lb else (shorter, b)

    def _prefixes(
        self,
        texts: list[str],
        special: bool,
        detailed: bool,
        keep: Callable[[int, Encoding, bool], None],
        needed: Callable[[int], bool] | None = None,
    ) -> None:
        """The bounded-prefix tokenization of `texts` (see `encode`): `keep(i, encoding, cut)` once per text,
        at most max_length tokens each (`special`: special tokens included), `cut` when the text has more.
        `needed(i)` False: text i is given up (its call is refused anyway)."""
        # encode_batch_fast: the same ids, type ids and cuts, without token strings and offsets (0.20+)
        fast = None if detailed else getattr(self._cutting, "encode_batch_fast", None)
        encode_batch = fast or self._cutting.encode_batch
        prefix_chars = {i: PREFIX_CHARS_PER_TOKEN * self.max_length for i in range(len(texts))}
        while prefix_chars:
            ends = {i: self._prefix_end(texts[i], chars) for i, chars in prefix_chars.items()}
            longer: dict[int, int] = {}
            for chunk in _chunks(ends):
                encodings = encode_batch([texts[i][: ends[i]] for i in chunk], add_special_tokens=special)
                for i, encoding in zip(chunk, encodings, strict=True):
                    cut = bool(encoding.overflowing)  # more than max_length tokens: so is the whole text
                    if cut or ends[i] == len(texts[i]):
                        keep(i, encoding, cut)
                    else:
                        longer[i] = 2 * ends[i]
                del encodings
            prefix_chars = {i: c for i, c in longer.items() if needed is None or needed(i)}

    def _prefix_end(self, text: str, chars: int) -> int:
        if self._boundaries is None or chars >= len(text):
            return len(text)
        return self._boundaries.next_cut(text, chars)

    def count_tokens(self, text: str, special: bool = True) -> int:
        """The whole text's tokens (`special`: special tokens included), counted in pieces cut at word
        boundaries."""
        pieces, start = [], 0
        while start < len(text):
            end = (
                len(text)
                if self._boundaries is None
                else self._boundaries.next_cut(text, start + COUNT_PIECE_CHARS)
            )
            pieces.append(text[start:end])
            start = end
        count = self._whole.num_special_tokens_to_add(is_pair=False) if special else 0
        lengths = {k: len(piece) for k, piece in enumerate(pieces)}
        for chunk in _chunks(lengths):
            encodings = self._whole.encode_batch([pieces[k] for k in chunk], add_special_tokens=False)
            count += sum(len(e.ids) for e in encodings)
        return count

    def token_to_id(self, token: str) -> int | None:
        return self._whole.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        return self._whole.id_to_token(token_id) or ""

    def decode(self, ids: list[list[int]], skip_ids: set[int]) -> list[str]:
        """Decodes each id list, leaving out `skip_ids` (e.g. [CLS], [SEP], [PAD]) but keeping other specials."""
        kept = [[t for t in seq if t not in skip_ids] for seq in ids]
        return self._whole.decode_batch(kept, skip_special_tokens=False)
