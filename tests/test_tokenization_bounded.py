"""`ModelTokenizer.encode` tokenizes a bounded prefix of a long text (service/engine/word_boundaries.py): its results
must equal whole-text tokenization exactly (ids, type ids, tokens, offsets, special mask, truncated flag,
the refusal's token count), on random texts built from pieces that stress the cut points: whitespace runs,
punctuation, words around WordPiece's 100-character [UNK] rule, accents and combining marks, CJK, emoji,
added tokens written in the text, and texts exactly at the limit."""

from __future__ import annotations

import concurrent.futures
import random
import time

import pytest
from tokenizers import Tokenizer

from bertserve.export.default_model import default_checkpoint_dir
from bertserve.manifest import TokenizerSpec
from bertserve.service.engine import token_counts, tokenization, tokenizer_variants
from bertserve.service.engine.tokenization import ModelTokenizer
from bertserve.service.errors import InvalidInput

PIECES = [
    " ", "  ", "\t", "\n", "\r\n", " \u3000 ", "\u00a0", "\u2003",
    "the", "cat", "unbelievable", "don't", "Ünïcödé", "café", "e\u0301", "\u0301", "ΣΑΣ", "İstanbul", "ß", "ﬁ",
    "!", "...", "$", "+", "—", "«", "»", "¿", "・",
    "中", "文字", "日本語", "한국어", "\U00020000", "😀", "👍🏽", "\u200d", "\u200b",
    "a" * 99, "b" * 100, "c" * 101, "x" * 150,
    "[MASK]", "[CLS]", "[", "]", "MASK", "ٱلعربية", "Ⅻ", "\ufffd",
]  # fmt: skip
RANDOM_TEXTS = 300


def spec(path) -> TokenizerSpec:
    t = Tokenizer.from_file(str(path))
    ids = {"pad_token_id": t.token_to_id("[PAD]"), "mask_token_id": t.token_to_id("[MASK]")}
    return TokenizerSpec(sha256="0" * 64, **ids)


def tokenizer_files(make_tiny_checkpoint):
    return {
        "minilm": default_checkpoint_dir() / "tokenizer.json",
        "tiny": make_tiny_checkpoint("BertModel") / "tokenizer.json",
    }


def reference(path, max_length: int | None) -> Tokenizer:
    t = Tokenizer.from_file(str(path))
    t.no_padding()
    if max_length is None:
        t.no_truncation()
    else:
        t.enable_truncation(max_length)
    return t


def random_texts(seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    while len(texts) < RANDOM_TEXTS:
        text = "".join(rng.choice(PIECES) for _ in range(rng.choice([1, 3, 10, 40, 150])))
        if text.strip():
            texts.append(text)
    return texts


def at_limit_texts(max_length: int) -> list[str]:
    """Texts of max_length - 1, max_length and max_length + 1 tokens (special tokens included)."""
    return [" ".join(["the"] * (max_length - 2 + extra)) for extra in (-1, 0, 1)] + [
        "!" * (max_length - 2 + extra) for extra in (-1, 0, 1)
    ]


@pytest.mark.parametrize("max_length", [8, 40])
@pytest.mark.parametrize("vocab", ["minilm", "tiny"])
def test_prefix_tokenization_equals_whole_text_tokenization(
    make_tiny_checkpoint, monkeypatch, vocab, max_length
):
    path = tokenizer_files(make_tiny_checkpoint)[vocab]
    monkeypatch.setattr(token_counts, "CHUNK_CHARS", 2000)  # many chunks per call
    monkeypatch.setattr(token_counts, "COUNT_PIECE_CHARS", 50)  # many pieces per refused text
    ours = ModelTokenizer(path, spec(path), max_length)
    assert ours._boundaries is not None, "BERT's tokenizer is tokenized by prefixes"
    whole, cutting = reference(path, None), reference(path, max_length)
    texts = random_texts(max_length) + at_limit_texts(max_length)
    lengths = [len(e.ids) for e in whole.encode_batch(texts)]
    assert min(lengths) <= max_length < max(lengths), "the texts straddle the limit"
    cut = ours.encode(texts, truncate=True)
    for text, got, expected, length in zip(texts, cut, cutting.encode_batch(texts), lengths, strict=True):
        assert (got.ids.tolist(), got.type_ids.tolist()) == (expected.ids, expected.type_ids), repr(text)
        assert (got.tokens, got.offsets) == (expected.tokens, expected.offsets), repr(text)
        assert got.special == [bool(s) for s in expected.special_tokens_mask], repr(text)
        assert got.truncated == (length > max_length), repr(text)
    for text, length in zip(texts, lengths, strict=True):
        if length <= max_length:
            assert ours.encode([text], truncate=False)[0].ids.tolist() == whole.encode(text).ids
        else:
            with pytest.raises(InvalidInput, match=rf"^inputs\[0\]: {length} tokens is more than"):
                ours.encode([text], truncate=False)


def test_inputs_for_the_graph_alone_are_tokenized_without_details(make_tiny_checkpoint):
    """`detailed=False` (embed, classify, fill-mask) gives the same ids and cuts, and an input so tokenized
    refuses to give token strings, offsets or the special mask rather than give wrong ones."""
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    ours = ModelTokenizer(path, spec(path), 40)
    texts = random_texts(7)[:50] + at_limit_texts(40)
    fast = ours.encode(texts, truncate=True, detailed=False)
    for text, got, expected in zip(texts, fast, ours.encode(texts, truncate=True), strict=True):
        assert (got.ids.tolist(), got.type_ids.tolist()) == (
            expected.ids.tolist(),
            expected.type_ids.tolist(),
        )
        assert got.truncated == expected.truncated, repr(text)
        assert expected.detailed and not got.detailed, repr(text)
        for field in ("tokens", "offsets", "special"):
            with pytest.raises(ValueError, match="for the graph alone"):
                getattr(got, field)
    assert any(e.offsets[1] != (0, 0) for e in ours.encode(texts, truncate=True)), "offsets by default"


def test_refusal_names_the_first_too_long_input(make_tiny_checkpoint):
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    ours = ModelTokenizer(path, spec(path), 16)
    texts = ["short", "a b " * 4000, "fine too", "! " * 30, "x"]
    with pytest.raises(
        InvalidInput, match=r"^inputs\[1\]: 8002 tokens is more than the model's max_length 16"
    ):
        ours.encode(texts, truncate=False)


def test_a_long_text_is_tokenized_only_as_far_as_the_model_reads(make_tiny_checkpoint, monkeypatch):
    """The tokenizer sees a bounded prefix of each long text, never the whole of it."""
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    ours = ModelTokenizer(path, spec(path), 256)
    seen: list[int] = []
    encode_batch = ours._cutting["right"].encode_batch

    class Recording:
        def encode_batch(self, texts, *args, **kwargs):
            seen.extend(len(t) for t in texts)
            return encode_batch(texts, *args, **kwargs)

    monkeypatch.setattr(ours, "_cutting", {"right": Recording()})
    monkeypatch.setattr(ours, "_plain", None)  # every text through the recorded tokenizer
    for piece in ("!", "中", "word ", "ab, "):
        seen.clear()
        encoded = ours.encode([piece * (20_000 // len(piece))] * 8, truncate=True)
        assert all(e.length == 256 and e.truncated for e in encoded)
        assert max(seen) <= 2 * tokenization.PREFIX_CHARS_PER_TOKEN * 256, (piece, max(seen))


def test_cutting_variants_are_made_on_first_use_and_once(make_tiny_checkpoint, monkeypatch):
    """A model's tokenizer holds the whole and the right-cutting tokenizers from the start (each a copy of
    the vocabulary); the left-cutting one and each pair strategy's are made when a call first needs them,
    once however many threads ask at the same time, and cut as they should."""
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    ours = ModelTokenizer(path, spec(path), 8)
    ours._plain = None  # the plain-text variants (service/engine/plain_text.py) are made alike
    assert ours._cutting.made == ["right"] and ours._pairs.made == []
    text = "one two three four five six seven eight nine ten"
    assert ours.encode([text], True)[0].ids.tolist() == reference(path, 8).encode(text).ids
    assert ours._cutting.made == ["right"]
    reads = []
    real = tokenizer_variants.Tokenizer

    class Counted:
        @staticmethod
        def from_file(name: str) -> Tokenizer:
            reads.append(name)
            time.sleep(0.05)  # every thread asks while the first one reads
            return real.from_file(name)

    monkeypatch.setattr(tokenizer_variants, "Tokenizer", Counted)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        lefts = list(pool.map(lambda _: ours.encode([text], True, left=True)[0].ids.tolist(), range(8)))
        list(pool.map(lambda _: ours.encode_pairs([text], ["x"], True, "only_first"), range(8)))
    assert len(reads) == 2 and ours._cutting.made == ["right", "left"] and ours._pairs.made == ["only_first"]
    left = reference(path, 8)
    left.enable_truncation(8, direction="left")
    assert lefts == [left.encode(text).ids] * 8
