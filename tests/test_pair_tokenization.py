"""`ModelTokenizer.encode_pairs` (sentence pairs) equals transformers' `BertTokenizerFast(a, b,
truncation=strategy, max_length=M)` for every truncation strategy: ids, segment ids and the truncated flag,
on random texts and on texts far longer than max_length (each text tokenized as a bounded prefix). Pairs
too long without truncate, pairs that cannot fit, and unknown strategies are refused naming the field."""

from __future__ import annotations

import itertools
import random

import pytest
from transformers import BertTokenizerFast

from bertserve.service.engine import token_counts
from bertserve.service.engine.pair_truncation import TRUNCATION_STRATEGIES, PairNames
from bertserve.service.engine.tokenization import ModelTokenizer
from bertserve.service.errors import InvalidInput
from tests.test_tokenization_bounded import random_texts, spec, tokenizer_files


def long_texts() -> list[str]:
    """Texts around and far over the limits, of different and of equal token counts."""
    return [
        "the cat sat on the mat " * 2,
        "paris is the capital " * 50,  # 200 tokens
        "the dog " * 100,  # 200 tokens: as long as the one above
        "a " * 2000,
        "! " * 41,
        " ".join(["word1"] * 63),
        "x",
    ]


def reference(hf: BertTokenizerFast, a: str, b: str, strategy: str, max_length: int) -> dict | None:
    """transformers' encoding, or None where the tokenizer refuses (the pair cannot fit)."""
    try:
        return hf(a, b, truncation=strategy, max_length=max_length)
    except Exception:
        return None


@pytest.mark.parametrize("max_length", [16, 64])  # 13 and 61 tokens for the texts: odd, as BERT's 509
@pytest.mark.parametrize("vocab", ["minilm", "tiny"])
def test_pairs_equal_transformers_for_each_strategy(make_tiny_checkpoint, vocab, max_length):
    path = tokenizer_files(make_tiny_checkpoint)[vocab]
    ours = ModelTokenizer(path, spec(path), max_length)
    hf = BertTokenizerFast(tokenizer_file=str(path))
    rng = random.Random(max_length)
    texts = long_texts()
    pairs = list(itertools.product(texts, texts)) + [tuple(rng.sample(random_texts(3), 2)) for _ in range(60)]
    firsts, seconds = [a for a, _ in pairs], [b for _, b in pairs]
    whole = [len(hf(a, b)["input_ids"]) for a, b in pairs]
    assert min(whole) <= max_length < max(whole)
    for strategy in TRUNCATION_STRATEGIES:
        expected = [reference(hf, a, b, strategy, max_length) for a, b in pairs]
        fits = [i for i, e in enumerate(expected) if e is not None]
        assert len(fits) < len(pairs) or strategy == "longest_first"
        got = ours.encode_pairs([firsts[i] for i in fits], [seconds[i] for i in fits], True, strategy)
        for i, encoded in zip(fits, got, strict=True):
            where = (strategy, pairs[i][0][:40], pairs[i][1][:40])
            assert encoded.ids.tolist() == expected[i]["input_ids"], where
            assert encoded.type_ids.tolist() == expected[i]["token_type_ids"], where
            assert encoded.truncated == (whole[i] > max_length), where
        for i in set(range(len(pairs))) - set(fits):  # the text kept whole leaves no room for the other
            with pytest.raises(InvalidInput, match="tokens leave no room for"):
                ours.encode_pairs([firsts[i]], [seconds[i]], True, strategy)
        fitting = [i for i in range(len(pairs)) if whole[i] <= max_length]
        untouched = ours.encode_pairs(
            [firsts[i] for i in fitting], [seconds[i] for i in fitting], False, strategy
        )
        assert [e.ids.tolist() for e in untouched] == [
            hf(firsts[i], seconds[i])["input_ids"] for i in fitting
        ]


def test_detailed_pairs_carry_tokens_and_special_flags(make_tiny_checkpoint):
    path = tokenizer_files(make_tiny_checkpoint)["tiny"]
    ours = ModelTokenizer(path, spec(path), 16)
    (pair,) = ours.encode_pairs(["the cat"], ["a dog sat"], False, detailed=True)
    assert pair.tokens == ["[CLS]", "the", "cat", "[SEP]", "a", "dog", "sat", "[SEP]"]
    assert pair.special == [True, False, False, True, False, False, False, True]
    assert pair.type_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a_pair_too_long_is_refused_without_truncate(make_tiny_checkpoint):
    path = tokenizer_files(make_tiny_checkpoint)["tiny"]
    ours = ModelTokenizer(path, spec(path), 16)
    firsts, seconds = ["the cat", "the cat", "a " * 3000], ["fine", "a dog " * 10, "x"]
    with pytest.raises(
        InvalidInput,
        match=r"^inputs\[1\]: 25 tokens \(pair\) is more than the model's max_length 16 \(set truncate",
    ):
        ours.encode_pairs(firsts, seconds, False)
    # a text cut to its prefix still has its whole count named
    with pytest.raises(InvalidInput, match=r"^inputs\[0\]: 3004 tokens \(pair\) is more than"):
        ours.encode_pairs(firsts[2:], seconds[2:], False)


def test_a_pair_that_cannot_fit_names_the_text(make_tiny_checkpoint):
    path = tokenizer_files(make_tiny_checkpoint)["tiny"]
    ours = ModelTokenizer(path, spec(path), 16)
    rerank = PairNames(pair="documents[{i}]", first="query", second="documents[{i}]")
    query = "the cat " * 20  # 40 tokens alone
    with pytest.raises(
        InvalidInput,
        match=r"^query: 40 tokens leave no room for documents\[1\] within max_length 16 \(3 special tokens"
        r" included\); truncation_strategy only_second cuts only documents\[1\]",
    ):
        ours.encode_pairs(["x", query], ["a dog", "a dog"], True, "only_second", names=rerank)
    with pytest.raises(InvalidInput, match=r"^pairs\[0\]: 13 tokens leave no room for inputs\[0\]"):
        ours.encode_pairs(["a dog"], ["the " * 13], True, "only_first")


@pytest.mark.parametrize("strategy", ["", "longest-first", "ONLY_FIRST", "do_not_truncate"])
def test_unknown_strategies_are_refused(make_tiny_checkpoint, strategy):
    path = tokenizer_files(make_tiny_checkpoint)["tiny"]
    ours = ModelTokenizer(path, spec(path), 16)
    with pytest.raises(
        InvalidInput, match=r"^truncation_strategy: .* is not one of longest_first, only_first, only_second$"
    ):
        ours.encode_pairs(["a"], ["b"], False, strategy)


@pytest.mark.parametrize("strategy", ["only_first", "only_second"])
def test_cutting_a_text_to_a_few_tokens_costs_no_square_of_max_length(make_tiny_checkpoint, strategy):
    """The library splits what it cuts off into pieces the size of what it keeps and joins the other
    text to each: a long text kept to one token beside a text of max_length - 4 tokens would make
    max_length pieces of max_length tokens. The text to cut is pre-cut, so the pieces stay few."""
    path = tokenizer_files(make_tiny_checkpoint)["tiny"]
    max_length = 64
    ours = ModelTokenizer(path, spec(path), max_length)
    post = ours._pairs[strategy]
    pieces: list[int] = []

    class Recording:
        def post_process(self, *args, **kwargs):
            encoding = post.post_process(*args, **kwargs)
            pieces.append(sum(len(o.ids) for o in encoding.overflowing))
            return encoding

    ours._pairs = {strategy: Recording()}
    kept, cut = "the " * (max_length - 4), "a " * 500
    a, b = (kept, cut) if strategy == "only_second" else (cut, kept)
    (pair,) = ours.encode_pairs([a], [b], True, strategy)
    hf = BertTokenizerFast(tokenizer_file=str(path))
    assert pair.ids.tolist() == hf(a, b, truncation=strategy, max_length=max_length)["input_ids"]
    assert pieces and max(pieces) <= 2 * max_length, pieces


class CountedCharacters:
    """A tokenizer that adds up the characters it is given to tokenize (the `_whole` one, which counts)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.chars = tokenizer, 0

    def encode_batch_fast(self, texts, **options):
        self.chars += sum(len(t) for t in texts)
        return self.tokenizer.encode_batch_fast(texts, **options)

    def encode_batch(self, texts, **options):
        self.chars += sum(len(t) for t in texts)
        return self.tokenizer.encode_batch(texts, **options)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def words(rng: random.Random, count: int) -> str:
    vocabulary = ["the", "cat", "sat", "on", "a", "mat", "paris", "capital", "dog", "!", "x"]
    return " ".join(rng.choice(vocabulary) for _ in range(count))


def test_two_long_texts_are_ordered_as_transformers_does(make_tiny_checkpoint, monkeypatch):
    """longest_first with an odd room gives the extra token to the longer text: texts of several count
    pieces (and of different characters per token) one token apart or equal are ordered right."""
    monkeypatch.setattr(token_counts, "COUNT_PIECE_CHARS", 50)  # many pieces per text
    path = tokenizer_files(make_tiny_checkpoint)["tiny"]
    ours = ModelTokenizer(path, spec(path), 16)  # room 13: odd
    hf = BertTokenizerFast(tokenizer_file=str(path))
    texts = ["the cat " * 75, "a " * 150, "a " * 151, "the cat " * 75 + "x", "paris " * 149, "! " * 150]
    pairs = list(itertools.product(texts, texts))
    got = ours.encode_pairs([a for a, _ in pairs], [b for _, b in pairs], True)
    for (a, b), encoded in zip(pairs, got, strict=True):
        expected = hf(a, b, truncation="longest_first", max_length=16)
        assert encoded.ids.tolist() == expected["input_ids"], (a[:20], len(a), b[:20], len(b))
        assert encoded.type_ids.tolist() == expected["token_type_ids"]


def test_ordering_two_long_texts_costs_the_shorter_one_shared_texts_once(make_tiny_checkpoint):
    """Which of two texts over max_length is longer is counted in step and stops once it is known, each
    text's count kept for the call: a 1:N call with a long shared text counts each text at most once, and
    one pair costs about the shorter text, not both whole."""
    path = tokenizer_files(make_tiny_checkpoint)["tiny"]
    ours = ModelTokenizer(path, spec(path), 16)  # room 13: odd, so longest_first needs the longer text
    counted = ours._whole = CountedCharacters(ours._whole)
    rng = random.Random(5)
    query, documents = words(rng, 8000), [words(rng, 8000) for _ in range(12)]
    ours.encode_pairs([query] * len(documents), documents, True)
    assert 0 < counted.chars <= len(query) + sum(len(d) for d in documents)
    counted.chars = 0
    short, long = words(rng, 2000), words(rng, 40000)
    ours.encode_pairs([long], [short], True)
    assert 0 < counted.chars <= 2 * len(short) + 2 * token_counts.COUNT_PIECE_CHARS


def test_a_pair_without_room_is_refused_before_the_library_runs(make_tiny_checkpoint):
    """The no-room refusal is decided from the token counts, so the library's own errors are not taken
    for the client's (they stay server errors)."""
    path = tokenizer_files(make_tiny_checkpoint)["tiny"]
    ours = ModelTokenizer(path, spec(path), 16)

    class Failing:
        def post_process(self, *args, **kwargs):
            raise RuntimeError("the library failed")

    ours._pairs = {"only_second": Failing()}
    with pytest.raises(InvalidInput, match=r"^inputs\[0\]: 40 tokens leave no room for pairs\[0\]"):
        ours.encode_pairs(["the cat " * 20], ["a dog"], True, "only_second")
    with pytest.raises(RuntimeError, match="the library failed"):
        ours.encode_pairs(["the cat"], ["a dog " * 20], True, "only_second")
