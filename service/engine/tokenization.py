"""Tokenization with the Rust `tokenizers` library, sized by the manifest's max_length.

`encode` is blocking and meant to run in a worker thread (the library releases the GIL and encodes
a batch in parallel). Inputs longer than max_length are cut when the request says `truncate`, and
refused with the limit named otherwise. Its memory and time per input are bounded by max_length, not by
the length of the text (see `ModelTokenizer.encode`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from bertserve.manifest import TokenizerSpec
from bertserve.service.engine.native_wordpiece import NativeWordPiece, PlainEncoding
from bertserve.service.engine.pair_truncation import (
    INPUT_PAIRS,
    PairNames,
    check_strategy,
    no_room,
    ordered,
    pair_tokenizers,
    shortened,
)
from bertserve.service.engine.plain_text import PlainText
from bertserve.service.engine.token_counts import TokenCounts, chunks
from bertserve.service.engine.token_windows import token_windows
from bertserve.service.engine.tokenizer_variants import TokenizerVariants
from bertserve.service.engine.word_boundaries import WordBoundaries, supports_prefixes
from bertserve.service.errors import InvalidInput, StartupError


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


# The first prefix of a long text: this many characters per token the model can take (English averages
# 4 to 5 characters a token, spaces included, so most texts that fit are tokenized whole at once).
PREFIX_CHARS_PER_TOKEN = 6


def _whole(counts: TokenCounts, text: str, piece: Encoding, cut: bool) -> int:
    """The tokens of a whole text (no special tokens), of which `piece` is the first (all unless `cut`)."""
    return counts.whole(text) if cut else len(piece.ids)


def _encoded(encoding: Encoding, truncated: bool, detailed: bool, shift: int = 0) -> EncodedInput:
    """`shift`: where in the text the tokenized piece starts (a suffix's offsets are moved by it)."""
    ids = np.asarray(encoding.ids, dtype=np.int64)
    type_ids = np.asarray(encoding.type_ids, dtype=np.int64)
    if not detailed:
        return EncodedInput(ids, type_ids, truncated)
    special = [bool(s) for s in encoding.special_tokens_mask]
    offsets = encoding.offsets
    if shift:
        offsets = [o if s else (o[0] + shift, o[1] + shift) for o, s in zip(offsets, special, strict=True)]
    return EncodedInput(ids, type_ids, truncated, (encoding.tokens, offsets, special))


class ModelTokenizer:
    def __init__(self, path: Path, spec: TokenizerSpec, max_length: int, native: bool = True):
        def cutting(tokenizer: Tokenizer, key: str) -> None:
            direction, _, plain = key.partition("-")
            tokenizer.no_padding()
            tokenizer.enable_truncation(max_length, direction=direction)
            if plain:
                tokenizer.normalizer = None  # its texts come normalized (service/engine/plain_text.py)

        # by the direction they cut ("right": keep the first tokens), and "right-plain", "left-plain" for
        # plain texts, normalized before; each made when first asked for
        self._cutting = TokenizerVariants(path, cutting)
        try:
            self._whole = Tokenizer.from_file(str(path))
            self._cutting["right"]
        except Exception as exc:  # the library raises plain Exception for unreadable files
            raise StartupError(f"{path}: cannot read the tokenizer: {exc}") from None
        self._whole.no_truncation()
        self._whole.no_padding()
        self._pairs = pair_tokenizers(path, max_length)
        self._pair_specials = self._whole.num_special_tokens_to_add(is_pair=True)
        self.spec = spec
        self.max_length = max_length
        self.vocab_size = self._whole.get_vocab_size(with_added_tokens=True)
        tokens = list(self._whole.get_added_tokens_decoder().values())
        added = [t.content for t in tokens]
        config = json.loads(self._whole.to_str())  # the tokenizer's JSON, parsed once for the three below
        self._boundaries = WordBoundaries(added) if supports_prefixes(config) else None
        # normalized added tokens are matched as the normalizer spells them
        normalizer = self._whole.normalizer
        spelled = [normalizer.normalize_str(t.content) for t in tokens if t.normalized] if normalizer else []
        self._plain = PlainText.of(config, added + spelled)
        # the embed path's plain texts in C++ (ids only), where the tokenizer is BERT's and it builds here
        room = max_length - self._whole.num_special_tokens_to_add(is_pair=False)
        self._native = NativeWordPiece.of(config, room) if self._plain is not None and native else None
        for token, expected in ((spec.pad_token, spec.pad_token_id), (spec.mask_token, spec.mask_token_id)):
            actual = self._whole.token_to_id(token)
            if actual is not None and actual != expected:
                raise StartupError(f"{path}: token {token} has id {actual}, the manifest says {expected}")

    def encode(
        self, texts: list[str], truncate: bool, detailed: bool = True, left: bool = False
    ) -> list[EncodedInput]:
        """Blocking; run it off the event loop. `detailed` False: for the graph alone, the library skips
        the token strings and character offsets (about 15% less time per text) and only ids are kept.

        The work per input is bounded by what the model can take, not by the text: a long text is
        tokenized as a prefix that ends at a word boundary (see `word_boundaries`), first about
        PREFIX_CHARS_PER_TOKEN x max_length characters, doubled only while it yields no more than
        max_length tokens. Its tokens are exactly the first tokens of the whole text, so the prefix decides
        whether the text is too long and gives the truncated encoding. Texts are tokenized in groups of at
        most CHUNK_CHARS characters, each turned into bounded `EncodedInput`s before the next.

        `left` (with `truncate`): a too-long text keeps its LAST tokens (transformers' truncation_side
        "left"), from the mirror image: a bounded suffix that starts at a word boundary, whose tokens are
        the last tokens of the whole text.
        """
        results: dict[int, EncodedInput] = {}
        first_cut = [len(texts)]

        def keep(i: int, encoding: Encoding, cut: bool, start: int) -> None:
            results[i] = _encoded(encoding, cut, detailed, start)
            if cut:
                first_cut[0] = min(first_cut[0], i)

        # without truncate, only inputs before the first too-long one still matter
        needed = None if truncate else lambda i: i < first_cut[0]
        self._prefixes(texts, True, detailed, keep, needed, left=left and truncate)
        if not truncate:  # inputs after the first one cut may not be there
            self.refuse_cut(texts, results)
        return [results[i] for i in range(len(texts))]

    def refuse_cut(self, texts: list[str], encoded: dict[int, EncodedInput]) -> None:
        """InvalidInput naming the first of `texts` whose encoding (by its index) was cut at max_length, for
        a call that did not ask to truncate."""
        i = min((i for i, e in encoded.items() if e.truncated), default=None)
        if i is not None:
            raise InvalidInput(
                f"inputs[{i}]: {self.count_tokens(texts[i])} tokens is more than the model's max_length "
                f"{self.max_length} (set truncate to cut it)"
            )

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
        counts = self._counts()  # whole texts counted once per call, only where a pair needs it
        pair = functools.partial(self._pair, post, counts, strategy, truncate, detailed, names)
        results: list[EncodedInput] = []
        for chunk in chunks({i: len(firsts[i]) + len(seconds[i]) for i in range(len(firsts))}):
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

        def keep(k: int, encoding: Encoding, cut: bool, start: int) -> None:
            pieces[distinct[k]] = (encoding, cut)  # a prefix: start 0

        self._prefixes(distinct, False, detailed, keep)
        return pieces

    def _pair(
        self,
        post: Tokenizer,
        counts: TokenCounts,
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
            count = self._pair_specials + _whole(counts, first, a, a_cut) + _whole(counts, second, b, b_cut)
            raise InvalidInput(
                f"{names.pair.format(i=i)}: {count} tokens (pair) is more than the model's max_length "
                f"{self.max_length} (set truncate to cut it)"
            )
        room = self.max_length - self._pair_specials
        if cut and strategy != "longest_first":
            kept = (first, a, a_cut) if strategy == "only_second" else (second, b, b_cut)
            if len(kept[1].ids) >= room and len(a.ids) + len(b.ids) > room:  # nothing left for the other
                count = _whole(counts, *kept)
                raise InvalidInput(no_room(names, i, strategy, count, self.max_length, self._pair_specials))
            a, b = shortened(a, b, strategy, room)
        elif cut and len(a.ids) == len(b.ids) and (a_cut or b_cut) and room % 2:
            # two texts over max_length: which is longer is counted, at the cost of the shorter one
            a, b = ordered(a, b, counts.compare(first, second) if a_cut and b_cut else (1 if a_cut else -1))
        encoding = post.post_process(a, b)
        return _encoded(encoding, cut, detailed)

    def _prefixes(
        self,
        texts: list[str],
        special: bool,
        detailed: bool,
        keep: Callable[[int, Encoding, bool, int], None],
        needed: Callable[[int], bool] | None = None,
        left: bool = False,
    ) -> None:
        """The bounded-prefix tokenization of `texts` (see `encode`): `keep(i, encoding, cut, start)` once per
        text, at most max_length tokens each (`special`: special tokens included), `cut` when the text has
        more, `start` the piece's first character. `needed(i)` False: text i is given up (its call is
        refused anyway). `left`: bounded suffixes instead, cut on the left (tokens kept: the last ones)."""
        side = "left" if left else "right"

        def through(key: str, pieces: list[str]) -> list[Encoding]:
            if not pieces:
                return []
            tokenizer = self._cutting[key]
            # encode_batch_fast: the same ids, type ids and cuts, without token strings and offsets (0.20+)
            fast = None if detailed else getattr(tokenizer, "encode_batch_fast", None)
            return (fast or tokenizer.encode_batch)(pieces, add_special_tokens=special)

        def encode_batch(pieces: list[str]) -> list[Encoding]:
            """Plain pieces normalized here, through the tokenizer without a normalizer; the rest as they are."""
            if self._plain is None:
                return through(side, pieces)
            plain: list[int] = []
            others: list[int] = []
            for k, piece in enumerate(pieces):
                (plain if self._plain.plain(piece) else others).append(k)
            normalized = [self._plain.normalize(pieces[k]) for k in plain]
            if self._native is not None and special and not detailed and normalized:
                plain_done = self._native.encode(normalized, left)
            else:
                plain_done = through(f"{side}-plain", normalized)
            if not others:
                return plain_done
            encodings: list[Encoding | PlainEncoding | None] = [None] * len(pieces)
            for where, done in (
                (plain, plain_done),
                (others, through(side, [pieces[k] for k in others])),
            ):
                for k, encoding in zip(where, done, strict=True):
                    encodings[k] = encoding
            return encodings

        piece_chars = {i: PREFIX_CHARS_PER_TOKEN * self.max_length for i in range(len(texts))}
        while piece_chars:
            # each text's piece: [start, end), a prefix (start 0) or a suffix (end the text's length)
            spans = {
                i: (self._suffix_start(texts[i], chars), len(texts[i]))
                if left
                else (0, self._prefix_end(texts[i], chars))
                for i, chars in piece_chars.items()
            }
            longer: dict[int, int] = {}
            for chunk in chunks({i: end - start for i, (start, end) in spans.items()}):
                pieces = [texts[i][spans[i][0] : spans[i][1]] for i in chunk]
                encodings = encode_batch(pieces)
                del pieces
                for i, encoding in zip(chunk, encodings, strict=True):
                    start, end = spans[i]
                    cut = bool(encoding.overflowing)  # more than max_length tokens: so is the whole text
                    if cut or end - start == len(texts[i]):
                        keep(i, encoding, cut, start)
                    else:
                        longer[i] = 2 * (end - start)
                del encodings
            piece_chars = {i: c for i, c in longer.items() if needed is None or needed(i)}

    def _prefix_end(self, text: str, chars: int) -> int:
        if self._boundaries is None or chars >= len(text):
            return len(text)
        return self._boundaries.next_cut(text, chars)

    def _suffix_start(self, text: str, chars: int) -> int:
        """Where a suffix of at least `chars` characters starting at a word boundary begins (0: all)."""
        if self._boundaries is None or chars >= len(text):
            return 0
        return self._boundaries.previous_cut(text, len(text) - chars)

    def windows(
        self, texts: Sequence[str], length: int, overlap: int, max_windows: int
    ) -> list[list[EncodedInput]]:
        """Blocking: per text, overlapping windows of at most `length` tokens (special tokens included) that
        cover its whole tokenization (see `token_windows`); at most `max_windows` in all."""
        width = length - self._whole.num_special_tokens_to_add(is_pair=False)
        windows = token_windows(self._whole, texts, width, overlap, max_windows)
        return [[EncodedInput(ids, type_ids, False) for ids, type_ids in text] for text in windows]

    def count_tokens(self, text: str, special: bool = True) -> int:
        """The whole text's tokens (`special`: special tokens included), counted in pieces cut at word
        boundaries."""
        count = self._whole.num_special_tokens_to_add(is_pair=False) if special else 0
        return count + self._counts().whole(text)

    def _counts(self) -> TokenCounts:
        """A call's memo of whole-text counts (ids only: the library skips token strings and offsets)."""
        return TokenCounts(
            getattr(self._whole, "encode_batch_fast", self._whole.encode_batch), self._boundaries
        )

    def token_to_id(self, token: str) -> int | None:
        return self._whole.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        return self._whole.id_to_token(token_id) or ""

    def decode(self, ids: list[list[int]], skip_ids: set[int]) -> list[str]:
        """Decodes each id list, leaving out `skip_ids` (e.g. [CLS], [SEP], [PAD]) but keeping other specials."""
        kept = [[t for t in seq if t not in skip_ids] for seq in ids]
        return self._whole.decode_batch(kept, skip_special_tokens=False)
