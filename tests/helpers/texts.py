"""Random texts of known words, for tests that need many inputs of varied lengths."""

from __future__ import annotations

import numpy as np

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "is", "in", "paris", "capital", "of", "france"]
WORDS += ["river", "bank", "money", "tree", "house"]


def random_texts(n: int, seed: int, min_words: int = 1, max_words: int = 20) -> list[str]:
    """`n` texts of `min_words` to `max_words - 1` words drawn from WORDS, the same for the same seed."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(min_words, max_words)))) for _ in range(n)]
