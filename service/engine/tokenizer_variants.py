"""Tokenizers made from one file, each configured once for one kind of cut and never reconfigured
(tokenization runs on several threads). Each holds a whole copy of the vocabulary, so a variant is made
when a call first needs it: a server that never cuts on the left or tokenizes pairs holds the right-cutting
one and its plain-text twin (service/engine/plain_text.py), not every kind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer


class TokenizerVariants:
    """`variants[key]`: the tokenizer read from `path` and given `configure(tokenizer, key)`, made on first
    use (once, whichever thread asks first)."""

    def __init__(self, path: Path, configure: Callable[[Tokenizer, str], None]):
        self._path, self._configure = path, configure
        self._made: dict[str, Tokenizer] = {}
        self._lock = threading.Lock()

    def __getitem__(self, key: str) -> Tokenizer:
        tokenizer = self._made.get(key)
        if tokenizer is None:
            with self._lock:
                tokenizer = self._made.get(key)
                if tokenizer is None:
                    tokenizer = Tokenizer.from_file(str(self._path))
                    self._configure(tokenizer, key)
                    self._made[key] = tokenizer
        return tokenizer

    @property
    def made(self) -> list[str]:
        """The keys made so far."""
        return list(self._made)
