"""The benchmark's inputs: the shipped mixed-length corpus and fixed-length texts cut from it.

Token counts always come from the model's own tokenizer with [CLS] and [SEP] included and truncation
at the model's `max_length`, which is what the server counts as real tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

MIXED_CORPUS = Path(__file__).with_name("mixed.txt")


@dataclass(frozen=True)
class Corpus:
    name: str  # "mixed" or "fixed128"
    texts: list[str]
    tokens: list[int]  # real tokens per text, specials included, after truncation

    @property
    def mean_tokens(self) -> float:
        return sum(self.tokens) / len(self.tokens)

    def summary(self) -> dict:
        ordered = sorted(self.tokens)
        return {
            "name": self.name,
            "texts": len(self.texts),
            "mean_tokens": round(self.mean_tokens, 2),
            "min_tokens": ordered[0],
            "median_tokens": ordered[len(ordered) // 2],
            "max_tokens": ordered[-1],
        }


def load_tokenizer(path: Path, max_length: int) -> Tokenizer:
    """The tokenizer as the server uses it: no padding, truncation at the model's `max_length`."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    return tokenizer


def count_tokens(tokenizer: Tokenizer, texts: list[str]) -> list[int]:
    return [len(e.ids) for e in tokenizer.encode_batch(texts)]


def mixed_corpus(tokenizer: Tokenizer, limit: int | None = None, seed: int = 0) -> Corpus:
    """The shipped corpus in a seeded shuffled order (so any prefix has the same mix of lengths)."""
    texts = [line for line in MIXED_CORPUS.read_text().splitlines() if line.strip()]
    random.Random(seed).shuffle(texts)
    if limit is not None:
        texts = texts[:limit]
    return Corpus("mixed", texts, count_tokens(tokenizer, texts))


def fixed_length_corpus(tokenizer: Tokenizer, length: int, count: int, seed: int = 0) -> Corpus:
    """`count` texts of exactly `length` tokens each (at most the tokenizer's truncation length), cut from
    the mixed corpus at word ends."""
    source = [line for line in MIXED_CORPUS.read_text().splitlines() if line.strip()]
    rng = random.Random(seed)
    texts: list[str] = []
    attempts = 0
    while len(texts) < count:
        attempts += 1
        if attempts > 50 * count:
            raise RuntimeError(f"could not cut {count} texts of {length} tokens from the corpus")
        start = rng.randrange(len(source))
        long_text = " ".join(source[start : start + 40])
        encoding = tokenizer.encode(long_text, add_special_tokens=False)
        content = length - 2  # [CLS] and [SEP]
        if len(encoding.ids) <= content or encoding.tokens[content].startswith("##"):
            continue  # too short, or the cut would split a word and re-tokenize differently
        text = long_text[: encoding.offsets[content - 1][1]]
        if len(tokenizer.encode(text).ids) == length:
            texts.append(text)
    return Corpus(f"fixed{length}", texts, [length] * count)
