"""Tokenization with the Rust `tokenizers` library, sized by the manifest's max_length.

`encode` is blocking and meant to run in a worker thread (the library releases the GIL and encodes
a batch in parallel). Inputs longer than max_length are cut when the request says `truncate`, and
refused with the limit named otherwise. Its memory and time per input are bounded by max_length, not by
the length of the text (see `ModelTokenizer.encode`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from bertserve.manifest import TokenizerSpec
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
        # encode_batch_fast: the same ids, type ids and cuts, without token strings and offsets (0.20+)
        fast = None if detailed else getattr(self._cutting, "encode_batch_fast", None)
        encode_batch = fast or self._cutting.encode_batch
        prefix_chars = {i: PREFIX_CHARS_PER_TOKEN * self.max_length for i in range(len(texts))}
        while prefix_chars:
            ends = {i: self._prefix_end(texts[i], chars) for i, chars in prefix_chars.items()}
            longer: dict[int, int] = {}
            for chunk in _chunks(ends):
                encodings = encode_batch([texts[i][: ends[i]] for i in chunk])
                for i, encoding in zip(chunk, encodings, strict=True):
                    cut = bool(encoding.overflowing)  # more than max_length tokens: so is the whole text
                    if cut or ends[i] == len(texts[i]):
                        results[i] = _encoded(encoding, cut, detailed)
                    else:
                        longer[i] = 2 * ends[i]
                del encodings
            prefix_chars = longer
            refused = [i for i, r in results.items() if r.truncated]
            if refused and not truncate:  # only inputs before the first too-long one still matter
                prefix_chars = {i: c for i, c in prefix_chars.items() if i < min(refused)}
        refused = sorted(i for i, r in results.items() if r.truncated)
        if refused and not truncate:
            i = refused[0]
            raise InvalidInput(
                f"inputs[{i}]: {self.count_tokens(texts[i])} tokens is more than the model's max_length "
                f"{self.max_length} (set truncate to cut it)"
            )
        return [results[i] for i in range(len(texts))]

    def _prefix_end(self, text: str, chars: int) -> int:
        if self._boundaries is None or chars >= len(text):
            return len(text)
        return self._boundaries.next_cut(text, chars)

    def count_tokens(self, text: str) -> int:
        """The whole text's tokens (special tokens included), counted in pieces cut at word boundaries."""
        pieces, start = [], 0
        while start < len(text):
            end = (
                len(text)
                if self._boundaries is None
                else self._boundaries.next_cut(text, start + COUNT_PIECE_CHARS)
            )
            pieces.append(text[start:end])
            start = end
        count = self._whole.num_special_tokens_to_add(is_pair=False)
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
