"""Plain ASCII texts skip the tokenizer's BertNormalizer (service/engine/plain_text.py): every result must
equal the library's own tokenization with its normalizer (ids, type ids, tokens, offsets, special mask, cuts
on either side, pairs), for random texts of printable ASCII, tabs and line breaks in every case, and texts
that must not take the path (added tokens written in the text, control characters, non-ASCII) take the
tokenizer's own normalizer. The library's twin without a normalizer is what is checked here (`native` off);
tests/test_native_wordpiece.py checks the C++ WordPiece that the embed path's plain texts take by default."""

from __future__ import annotations

import json
import random

import pytest

from bertserve.service.engine.plain_text import PlainText
from bertserve.service.engine.tokenization import ModelTokenizer
from tests.test_tokenization_bounded import reference, spec, tokenizer_files

PLAIN = [
    " ", "  ", "\t", "\n", "\r\n", "The", "CAT", "sat", "on", "unbelievable", "don't", "Hello,", "WORLD!",
    "...", "$5", "+", "~`^", "Q&A", "e-mail", "(1)", "{x}", "a" * 99, "B" * 100, "c" * 101, "x" * 150,
]  # fmt: skip
NOT_PLAIN = ["[MASK]", "[", "\x01", "\x0b", "\x7f", "café", "中", "\u00a0"]


def texts(seed: int, count: int = 200) -> list[str]:
    """Random texts, about nine in ten plain."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        pieces = [rng.choice(PLAIN) for _ in range(rng.choice([1, 3, 10, 40, 120]))]
        if rng.random() < 0.1:
            pieces.insert(rng.randrange(len(pieces) + 1), rng.choice(NOT_PLAIN))
        if "".join(pieces).strip():
            out.append("".join(pieces))
    return out


def assert_same(got, expected, text: str, detailed: bool, max_length: int, whole_length: int) -> None:
    assert (got.ids.tolist(), got.type_ids.tolist()) == (expected.ids, expected.type_ids), repr(text)
    assert got.truncated == (whole_length > max_length), repr(text)
    if detailed:
        assert (got.tokens, got.offsets) == (expected.tokens, expected.offsets), repr(text)
        assert got.special == [bool(s) for s in expected.special_tokens_mask], repr(text)


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("detailed", [True, False])
@pytest.mark.parametrize("max_length", [8, 40])
@pytest.mark.parametrize("vocab", ["minilm", "tiny"])
def test_plain_texts_tokenize_as_the_library_does(make_tiny_checkpoint, vocab, max_length, detailed, left):
    path = tokenizer_files(make_tiny_checkpoint)[vocab]
    ours = ModelTokenizer(path, spec(path), max_length, native=False)
    assert ours._plain is not None, "BERT's tokenizers take the plain path"
    sample = texts(max_length + 2 * detailed + left)
    cutting = reference(path, max_length)
    cutting.enable_truncation(max_length, direction="left" if left else "right")
    lengths = [len(e.ids) for e in reference(path, None).encode_batch(sample)]
    got = ours.encode(sample, truncate=True, detailed=detailed, left=left)
    for text, one, expected, length in zip(sample, got, cutting.encode_batch(sample), lengths, strict=True):
        assert_same(one, expected, text, detailed, max_length, length)
    assert f"{'left' if left else 'right'}-plain" in ours._cutting.made, "the plain path was taken"


def test_pairs_of_plain_texts_tokenize_as_through_the_normalizer(make_tiny_checkpoint):
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    ours, through = ModelTokenizer(path, spec(path), 24, False), ModelTokenizer(path, spec(path), 24, False)
    through._plain = None
    firsts, seconds = texts(1, 60), texts(2, 60)  # many over max_length: cut, longest first
    got = ours.encode_pairs(firsts, seconds, True, detailed=True)
    expected = through.encode_pairs(firsts, seconds, True, detailed=True)
    for a, b in zip(got, expected, strict=True):
        assert (a.ids.tolist(), a.type_ids.tolist(), a.truncated) == (
            b.ids.tolist(),
            b.type_ids.tolist(),
            b.truncated,
        )
        assert (a.tokens, a.offsets, a.special) == (b.tokens, b.offsets, b.special)
    assert "right-plain" in ours._cutting.made and "right-plain" not in through._cutting.made


@pytest.mark.parametrize("text", ["a [MASK] b", "bell\x07", "tab\x0bstop", "café", "über 中文"])
def test_texts_the_normalizer_would_change_otherwise_keep_it(make_tiny_checkpoint, text):
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    ours = ModelTokenizer(path, spec(path), 32, native=False)
    got = ours.encode([text], truncate=True)[0]
    expected = reference(path, 32).encode(text)
    assert (got.ids.tolist(), got.tokens, got.offsets) == (expected.ids, expected.tokens, expected.offsets)
    assert ours._cutting.made == ["right"], "the tokenizer's own normalizer"


def test_a_normalizer_that_keeps_case_keeps_it(make_tiny_checkpoint, tmp_path):
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    tokenizer = json.loads(path.read_text())
    tokenizer["normalizer"]["lowercase"] = False
    cased = tmp_path / "tokenizer.json"
    cased.write_text(json.dumps(tokenizer))
    ours = ModelTokenizer(cased, spec(cased), 40, native=False)
    sample = texts(5, 80)
    got = ours.encode(sample, truncate=True)
    for text, one, expected in zip(sample, got, reference(cased, 40).encode_batch(sample), strict=True):
        same = (one.ids.tolist(), one.tokens, one.offsets) == (
            expected.ids,
            expected.tokens,
            expected.offsets,
        )
        assert same, repr(text)
    assert "right-plain" in ours._cutting.made


@pytest.mark.parametrize(
    "normalizer",
    [None, {"type": "NFKC"}, {"type": "BertNormalizer", "clean_text": False, "lowercase": True}],
)
def test_other_normalizers_take_no_plain_path(normalizer):
    assert PlainText.of({"normalizer": normalizer}, ["[CLS]"]) is None
