"""Left truncation (`ModelTokenizer.encode(left=True)`): a too-long text keeps its last tokens, tokenized
from a bounded suffix that starts at a word boundary (service/engine/word_boundaries.py `previous_cut`).
Its results must equal whole-text tokenization cut on the left (transformers' truncation_side "left" is
the `tokenizers` truncation direction "left"), and its work must not grow with the text."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from bertserve.service.engine import tokenization
from bertserve.service.engine.tokenization import ModelTokenizer
from bertserve.service.engine.word_boundaries import WordBoundaries
from tests.test_tokenization_bounded import at_limit_texts, random_texts, spec, tokenizer_files


def left_reference(path, max_length: int) -> Tokenizer:
    t = Tokenizer.from_file(str(path))
    t.no_padding()
    t.enable_truncation(max_length, direction="left")
    return t


@pytest.mark.parametrize("max_length", [8, 40])
@pytest.mark.parametrize("vocab", ["minilm", "tiny"])
def test_suffix_tokenization_equals_whole_text_cut_on_the_left(make_tiny_checkpoint, vocab, max_length):
    path = tokenizer_files(make_tiny_checkpoint)[vocab]
    ours = ModelTokenizer(path, spec(path), max_length)
    texts = random_texts(max_length + 1) + at_limit_texts(max_length)
    got = ours.encode(texts, truncate=True, left=True)
    right = ours.encode(texts, truncate=True)
    assert any(g.ids.tolist() != r.ids.tolist() for g, r in zip(got, right, strict=True)), "sides differ"
    for text, g, expected in zip(
        texts, got, left_reference(path, max_length).encode_batch(texts), strict=True
    ):
        assert (g.ids.tolist(), g.type_ids.tolist()) == (expected.ids, expected.type_ids), repr(text)
        assert (g.tokens, g.offsets) == (expected.tokens, expected.offsets), repr(text)
        assert g.truncated == bool(expected.overflowing), repr(text)
    fast = ours.encode(texts, truncate=True, detailed=False, left=True)
    assert [f.ids.tolist() for f in fast] == [g.ids.tolist() for g in got]


def test_a_long_text_is_tokenized_only_as_far_back_as_the_model_reads(make_tiny_checkpoint, monkeypatch):
    """The tokenizer sees a bounded suffix of each long text, never the whole of it: a huge text costs
    about what one just over the limit does."""
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    ours = ModelTokenizer(path, spec(path), 256)
    seen: list[int] = []
    encode_batch = ours._cutting["left"].encode_batch

    class Recording:
        def encode_batch(self, texts, *args, **kwargs):
            seen.extend(len(t) for t in texts)
            return encode_batch(texts, *args, **kwargs)

    monkeypatch.setattr(ours, "_cutting", {"left": Recording()})
    monkeypatch.setattr(ours, "_plain", None)  # every text through the recorded tokenizer
    for piece in ("!", "中", "word ", "ab, "):
        seen.clear()
        encoded = ours.encode([piece * (20_000 // len(piece))] * 8, truncate=True, left=True)
        assert all(e.length == 256 and e.truncated for e in encoded)
        assert max(seen) <= 2 * tokenization.PREFIX_CHARS_PER_TOKEN * 256, (piece, max(seen))
        assert seen, "left truncation tokenizes through the left-cutting tokenizer"


def test_previous_cut_is_a_word_boundary_outside_added_tokens():
    boundaries = WordBoundaries(["[MASK]"])
    text = "hello world[MASK]abc"
    assert boundaries.previous_cut(text, 8) == 6  # after the space
    assert boundaries.previous_cut(text, 5) == 5  # before the space
    assert boundaries.previous_cut(text, 15) == 11  # not inside [MASK]: before it
    assert boundaries.previous_cut("abcdef", 4) == 0  # no boundary: the whole text
    long = "x" * 1000 + " " + "y" * 1000
    assert boundaries.previous_cut(long, 1900) == 1001
