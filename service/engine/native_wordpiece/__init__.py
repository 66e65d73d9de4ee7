"""BERT's WordPiece for plain texts in C++ (wordpiece.cc, built on first use and loaded with ctypes).

The `tokenizers` library spends most of a plain text's tokenization on what a plain text does not need
(alignments of every character, token strings, Python objects per encoding: docs/performance/history.md,
Round 21). For the embed path (ids only) of a text that `PlainText` accepts, this gives the same ids,
and whether the text has more tokens than kept, at a fraction of the cost; every other text, and every call
that wants tokens or offsets, goes through the library as before.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import numpy as np

from bertserve.service.native_build import NativeUnavailable, built, cached

SOURCE = Path(__file__).with_name("wordpiece.cc")
_I64 = ctypes.c_void_p  # an int64 array: its address (`ndarray.ctypes.data`)
_LIBRARY: ctypes.CDLL | None = None
_LOCK = threading.Lock()
log = logging.getLogger("bertserve.tokenizer")

__all__ = ["NativeWordPiece", "NativeUnavailable", "library"]


def library_file() -> Path:
    """Where the library is cached (`library` builds it there)."""
    return cached(SOURCE, "bertserve-wordpiece", ".so")


def library() -> ctypes.CDLL:
    """wordpiece.cc built (once per source, in the cache of service/native_build.py) and loaded."""
    global _LIBRARY
    with _LOCK:
        if _LIBRARY is None:
            lib = ctypes.CDLL(str(built(SOURCE, library_file(), _loads, True, ())))
            lib.wordpiece_new.restype = ctypes.c_void_p
            lib.wordpiece_new.argtypes = [ctypes.c_char_p, _I64, _I64, ctypes.c_int64, ctypes.c_char_p]
            lib.wordpiece_new.argtypes += [ctypes.c_int64] * 4
            lib.wordpiece_free.argtypes = [ctypes.c_void_p]
            lib.wordpiece_encode.restype = ctypes.c_int
            lib.wordpiece_encode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _I64, ctypes.c_int64]
            lib.wordpiece_encode.argtypes += [ctypes.c_int64, ctypes.c_int32, _I64, _I64, _I64]
            _LIBRARY = lib
        return _LIBRARY


def _loads(path: Path) -> bool:
    try:
        return path.exists() and bool(ctypes.CDLL(str(path)).wordpiece_new)
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True, slots=True)
class PlainEncoding:
    """What `ModelTokenizer` reads of a library `Encoding` on the embed path: ids with [CLS] and [SEP],
    segment ids, and whether the text had more tokens than kept (`overflowing`, true or empty)."""

    ids: np.ndarray
    type_ids: np.ndarray
    overflowing: bool


class NativeWordPiece:
    """A tokenizer JSON's BertPreTokenizer + WordPiece + [CLS] ... [SEP], over normalized plain text."""

    def __init__(
        self,
        vocab: dict[str, int],
        prefix: str,
        unknown: int,
        cls: int,
        sep: int,
        max_word_chars: int,
        keep: int,
    ):
        """`keep`: the word pieces a text keeps (the model's max_length less [CLS] and [SEP])."""
        tokens = [token.encode() for token in vocab]
        lengths = np.array([len(t) for t in tokens], dtype=np.int64)
        ids = np.array(list(vocab.values()), dtype=np.int64)
        self._lib = library()
        self._keep = keep
        self._zeros = np.zeros(keep + 2, dtype=np.int64)  # every encoding's segment ids: views of it
        self._zeros.setflags(write=False)
        self._handle = None
        handle = self._lib.wordpiece_new(
            b"".join(tokens), lengths.ctypes.data, ids.ctypes.data, len(tokens), prefix.encode(),
            unknown, cls, sep, min(max(max_word_chars, 0), 2**32 - 1),  # no text holds a longer word
        )  # fmt: skip
        if not handle:
            raise MemoryError("the native WordPiece's vocabulary table")
        self._handle = handle

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.wordpiece_free(handle)

    @classmethod
    def of(cls, config: dict, keep: int) -> NativeWordPiece | None:
        """For a tokenizer (its tokenizer.json, parsed) that pre-tokenizes as BERT, matches by WordPiece and
        wraps a text in two special tokens ([CLS] $A [SEP], segment 0), each text keeping `keep` word pieces;
        None for any other, or where the library cannot be built here (logged)."""
        model = config.get("model") or {}
        pre_tokenizer = (config.get("pre_tokenizer") or {}).get("type")
        ends = _single_template(config.get("post_processor") or {})
        vocab = model.get("vocab") or {}
        prefix = model.get("continuing_subword_prefix") or ""
        bert = pre_tokenizer == "BertPreTokenizer" and model.get("type") == "WordPiece"
        # the C side reads the prefix up to a NUL
        if not bert or ends is None or model.get("unk_token") not in vocab or "\0" in prefix:
            return None
        try:
            return cls(
                vocab, prefix, vocab[model["unk_token"]], *ends,
                int(model.get("max_input_chars_per_word", 100)), keep,
            )  # fmt: skip
        except (NativeUnavailable, OSError, RuntimeError) as why:  # also: no home for its cache, no source
            log.warning("plain texts tokenized by the library: the native WordPiece is unavailable (%s)", why)
            return None

    def encode(self, texts: Sequence[str], left: bool) -> list[PlainEncoding]:
        """Each normalized plain text as [CLS], its first (`left`: last) `keep` word pieces, [SEP]."""
        keep, zeros = self._keep, self._zeros
        data = "".join(texts).encode("ascii")
        count = len(texts)
        sizes = [len(text) for text in texts]
        # each text's end, each row's start (room for min(its characters, keep) + 2 ids), its word pieces
        counts = np.empty(3 * count, dtype=np.int64)
        ends, starts, totals = counts[:count], counts[count : 2 * count], counts[2 * count :]
        ends[:] = list(accumulate(sizes))
        rows = list(accumulate((min(size, keep) + 2 for size in sizes), initial=0))
        starts[:] = rows[:-1]
        out = np.empty(rows[-1], dtype=np.int64)
        at = counts.ctypes.data  # the three arrays' addresses: at, +8n, +16n
        if self._lib.wordpiece_encode(
            self._handle, data, at, count, keep, left, out.ctypes.data, at + 8 * count, at + 16 * count
        ):
            raise MemoryError("the native WordPiece ran out of memory")
        encodings = []
        for start, total in zip(rows[:-1], totals.tolist(), strict=True):
            kept = min(total, keep) + 2
            encodings.append(PlainEncoding(out[start : start + kept], zeros[:kept], total > keep))
        return encodings


def _single_template(post: dict) -> tuple[int, int] | None:
    """The ids of the special tokens a post-processor writes one text between ([CLS] $A [SEP], all in
    segment 0); None for any other post-processor."""
    if post.get("type") == "BertProcessing":
        return int(post["cls"][1]), int(post["sep"][1])
    if post.get("type") != "TemplateProcessing":
        return None
    single = post.get("single") or []
    shape = [(kind, part["id"], part["type_id"]) for item in single for kind, part in item.items()]
    if len(shape) != 3 or [s[0] for s in shape] != ["SpecialToken", "Sequence", "SpecialToken"]:
        return None
    if shape[1][1] != "A" or any(type_id for *_, type_id in shape):
        return None
    ids = [(post.get("special_tokens") or {}).get(shape[k][1], {}).get("ids") for k in (0, 2)]
    if any(not isinstance(i, list) or len(i) != 1 for i in ids):
        return None
    return ids[0][0], ids[1][0]
