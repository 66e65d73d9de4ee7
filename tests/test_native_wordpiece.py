"""The C++ WordPiece of the embed path (service/engine/native_wordpiece/): for plain texts, tokenized for the
graph alone (ids), every result must equal the library's own tokenization with its normalizer (ids, type
ids, whether it was cut, on either side), for random printable ASCII (punctuation runs, words of 100 and 101
characters, words the vocabulary cannot spell), and a call's other texts keep the library's path in their
places. Tokenizers it does not know, and a machine where it cannot be built, keep the library."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import string

import pytest

from bertserve.service.engine import native_wordpiece
from bertserve.service.engine.model_registry import load
from bertserve.service.engine.native_wordpiece import NativeUnavailable, NativeWordPiece
from bertserve.service.engine.process import Engine
from bertserve.service.engine.tokenization import ModelTokenizer
from bertserve.service.errors import InvalidInput
from bertserve.service.metrics import Metrics
from bertserve.service.settings import Settings, load_settings
from tests.test_plain_text import texts
from tests.test_tokenization_bounded import reference, spec, tokenizer_files

# printable ASCII but "[" (the first character of the added tokens), with spaces, tabs and line breaks
CHARACTERS = string.ascii_letters + string.digits + string.punctuation.replace("[", "") + " \t\n\r" + " " * 20


def ascii_texts(seed: int, count: int = 150) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        text = "".join(rng.choice(CHARACTERS) for _ in range(rng.choice([0, 1, 5, 40, 300])))
        if rng.random() < 0.2:  # a long word: at max_input_chars_per_word (100), one over, far over
            text += " " + rng.choice(string.ascii_lowercase) * rng.choice([100, 101, 250]) + " end"
        out.append(text)
    return out


def counted(tokenizer: ModelTokenizer) -> list[int]:
    """How many texts each of `tokenizer`'s native calls took (wraps its native WordPiece)."""
    calls: list[int] = []
    native = tokenizer._native
    assert native is not None, "BERT's tokenizers take the native path"
    encode = native.encode
    native.encode = lambda texts, left: calls.append(len(texts)) or encode(texts, left)
    return calls


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("max_length", [8, 40, 512])
@pytest.mark.parametrize("vocab", ["minilm", "tiny"])
def test_plain_texts_get_the_library_ids(make_tiny_checkpoint, vocab, max_length, left):
    path = tokenizer_files(make_tiny_checkpoint)[vocab]
    ours = ModelTokenizer(path, spec(path), max_length)
    calls = counted(ours)
    sample = ascii_texts(max_length + left) + texts(max_length + left, 100)  # the second: 1 in 10 not plain
    cutting = reference(path, max_length)
    cutting.enable_truncation(max_length, direction="left" if left else "right")
    lengths = [len(e.ids) for e in reference(path, None).encode_batch(sample)]
    got = ours.encode(sample, truncate=True, detailed=False, left=left)
    for text, one, expected, length in zip(sample, got, cutting.encode_batch(sample), lengths, strict=True):
        assert (one.ids.tolist(), one.type_ids.tolist()) == (expected.ids, expected.type_ids), repr(text)
        assert one.truncated == (length > max_length), repr(text)
        assert one.ids.dtype == one.type_ids.dtype == "int64"
    plain = sum(ours._plain.plain(text) for text in sample)
    assert 0 < plain < len(sample) and sum(calls) >= plain, "every plain text went native, the others not"
    assert not any(key.endswith("-plain") for key in ours._cutting.made), "no library twin was needed"


def test_detailed_calls_and_pairs_keep_the_library(make_tiny_checkpoint):
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    ours = ModelTokenizer(path, spec(path), 32)
    calls = counted(ours)
    one = ours.encode(["Hello, world!"], truncate=True, detailed=True)[0]
    assert one.tokens == ["[CLS]", "hello", ",", "world", "!", "[SEP]"] and one.offsets[1] == (0, 5)
    ours.encode_pairs(["a question"], ["an answer"], truncate=True)
    assert calls == [], "tokens, offsets and pairs need the library's encodings"


def test_a_text_too_long_without_truncate_is_refused_with_its_count(make_tiny_checkpoint):
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    ours = ModelTokenizer(path, spec(path), 16)
    calls = counted(ours)
    text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
    with pytest.raises(InvalidInput, match=r"inputs\[1\]: 17 tokens is more than the model's max_length 16"):
        ours.encode(["short", text], truncate=False, detailed=False)
    assert calls, "the cut was seen by the native path"


def test_a_piece_holds_only_its_own_ids(make_tiny_checkpoint):
    """Rows share one buffer sized by the texts' characters, not texts x max_length."""
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    got = ModelTokenizer(path, spec(path), 512).encode(["a"] * 1000, truncate=True, detailed=False)
    assert got[0].ids.base is got[-1].ids.base
    assert got[0].ids.base.nbytes == 1000 * 3 * 8


@pytest.mark.parametrize(
    "change",
    [
        {"pre_tokenizer": {"type": "Whitespace"}},
        {"model": {"type": "BPE"}},
        {"post_processor": None},
        {"post_processor": {"type": "ByteLevel"}},
        {
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"Sequence": {"id": "A", "type_id": 0}}],
            }
        },
    ],
    ids=["pre-tokenizer", "model", "no post-processor", "other post-processor", "no special tokens"],
)
def test_other_tokenizers_take_no_native_path(make_tiny_checkpoint, change):
    described = json.loads(tokenizer_files(make_tiny_checkpoint)["minilm"].read_text())
    for key, value in change.items():
        described[key] = value if key != "model" else described[key] | value
    assert NativeWordPiece.of(described, 30) is None


@pytest.mark.parametrize(
    "error",
    [
        NativeUnavailable("no C++ compiler (Debian: g++)"),
        RuntimeError("Could not determine home directory."),  # the cache's folder, with no HOME
        FileNotFoundError("wordpiece.cc"),
    ],
    ids=["no compiler", "no home", "no source"],
)
def test_without_a_compiler_the_library_tokenizes(make_tiny_checkpoint, monkeypatch, caplog, error):
    def unavailable():
        raise error

    monkeypatch.setattr(native_wordpiece, "library", unavailable)
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    with caplog.at_level(logging.WARNING, "bertserve.tokenizer"):
        ours = ModelTokenizer(path, spec(path), 32)
    assert ours._native is None and str(error) in caplog.text
    got = ours.encode(["Hello, world!"], truncate=True, detailed=False)[0]
    assert got.ids.tolist() == reference(path, 32).encode("Hello, world!").ids


def test_the_setting_turns_it_off(tiny_repo):
    settings = Settings(model_repo=tiny_repo, models=["tiny-embed"], provider="cpu")
    on = load(settings, front=True).resolve("tiny-embed", None).tokenizer
    off = load(settings.model_copy(update={"native_tokenizer": False}), front=True)
    assert on._native is not None and off.resolve("tiny-embed", None).tokenizer._native is None


@pytest.mark.parametrize("native", [True, False])
def test_added_tokens_in_either_case_keep_the_library(make_tiny_checkpoint, tmp_path, native):
    """Tokens added as normalized (transformers' add_tokens) match the lowercased text: "COVID" is the added
    "covid", and "qzx" the added "QZX"; neither plain path may split them into word pieces."""
    tokenizer = reference(tokenizer_files(make_tiny_checkpoint)["minilm"], 32)
    tokenizer.add_tokens(["covid", "QZX"])
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    sample = ["COVID 19", "qzx", "QZX here", "Covid and covid", "nothing added"]
    got = ModelTokenizer(path, spec(path), 32, native).encode(sample, truncate=True, detailed=False)
    assert [one.ids.tolist() for one in got] == [e.ids for e in tokenizer.encode_batch(sample)]


def test_a_word_limit_past_32_bits_reads_as_no_limit(make_tiny_checkpoint, tmp_path):
    described = json.loads(tokenizer_files(make_tiny_checkpoint)["minilm"].read_text())
    described["model"]["max_input_chars_per_word"] = 2**32 + 3
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(described))
    ours = ModelTokenizer(path, spec(path), 512)
    assert ours._native is not None
    sample = ["abcdef", "x" * 300 + " y"]
    got = ours.encode(sample, truncate=True, detailed=False)
    assert [one.ids.tolist() for one in got] == [e.ids for e in reference(path, 512).encode_batch(sample)]


def test_a_subword_prefix_with_a_nul_takes_no_native_path(make_tiny_checkpoint):
    described = json.loads(tokenizer_files(make_tiny_checkpoint)["minilm"].read_text())
    described["model"]["continuing_subword_prefix"] = "#\x00"
    assert NativeWordPiece.of(described, 30) is None


def test_an_engine_of_several_holds_no_native_table(tiny_repo, tmp_path):
    """The fronts tokenize; an engine process's tokenizers only warm its graphs up (with tokens and offsets,
    the library's path), so it neither builds nor holds the WordPiece's table."""

    async def started() -> list:
        engine = Engine(settings, f"{tmp_path}/engine", Metrics())
        await engine.start()
        try:
            return [model.tokenizer for model in engine.registry.ordered]
        finally:
            engine.stop()

    settings = load_settings(model_repo=tiny_repo, models=["tiny-embed"], metrics_port=-1, http_port=-1)
    assert settings.native_tokenizer
    assert [tokenizer._native for tokenizer in asyncio.run(started())] == [None]
