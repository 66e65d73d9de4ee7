"""BERT's normalizer done in Python for plain ASCII text, where it is a lowercase and a whitespace swap.

`tokenizers` spends about 40% of a short text's tokenization in its BertNormalizer (Unicode cleanup, accents,
CJK spacing and the alignment of every character; docs/performance/history.md, Round 20). For a text of
printable ASCII, tabs and line breaks only, that normalizer changes nothing but the case (when it
lowercases) and the three whitespace characters (to spaces): `normalize` does that in one C call, keeping
every character where it was, so a tokenizer without a normalizer gives the same ids, tokens and offsets.
Texts that hold a character an added token starts with, in either case ([CLS], [MASK]; a token added as
normalized, such as transformers' `add_tokens`, is matched in the normalized text: its normalized spelling
counts too) take the tokenizer's own normalizer, as does every text of any other tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

NOT_PLAIN = re.compile(r"[^\t\n\r\x20-\x7e]")  # anything but printable ASCII, tab, line feed, return
WHITESPACE = str.maketrans("\t\n\r", "   ")


class PlainText:
    """`normalize` for the texts `plain` accepts, for a tokenizer whose normalizer is a BertNormalizer."""

    def __init__(self, lowercase: bool, added: Sequence[str]):
        self._lowercase = lowercase
        # an added token is matched before (or, when normalized, after) the normalizer: either case excludes it
        starts = sorted(
            {c for token in added if token for c in (token[0], token[0].lower(), token[0].upper())}
        )
        self._added = re.compile("[" + "".join(re.escape(c) for c in starts) + "]") if starts else None

    @classmethod
    def of(cls, config: dict, added: Sequence[str]) -> PlainText | None:
        """For a tokenizer (its tokenizer.json, parsed) normalized by a BertNormalizer that cleans text; None
        otherwise."""
        normalizer = config.get("normalizer") or {}
        if normalizer.get("type") != "BertNormalizer" or not normalizer.get("clean_text", True):
            return None
        return cls(bool(normalizer.get("lowercase", True)), added)

    def plain(self, text: str) -> bool:
        """Whether `text` is plain: ASCII the normalizer would only recase and respace."""
        return not NOT_PLAIN.search(text) and (self._added is None or not self._added.search(text))

    def normalize(self, text: str) -> str:
        """What the BertNormalizer makes of a plain `text`, character for character."""
        text = text.translate(WHITESPACE)
        return text.lower() if self._lowercase else text
