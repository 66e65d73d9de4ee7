"""Where a text may be cut so that the tokens of the part before the cut are a prefix of the whole text's
tokens, for BERT's tokenizer pipeline (`tokenizers`' BertNormalizer, BertPreTokenizer, WordPiece).

BERT's normalizer acts on one character at a time (clean-up, spaces around CJK characters, accents,
lowercase) and its pre-tokenizer splits at whitespace and isolates punctuation, so every word ends at
such a character and WordPiece splits each word on its own. A cut next to whitespace, punctuation or a CJK
character therefore never splits a word, and the words (hence the tokens, ids and offsets) before the cut
are the same whether or not the text goes on. Added tokens ([MASK], ...) are matched on the raw text before
that pipeline, so a cut through one of them is not a word boundary: `WordBoundaries` refuses those.

`tokenization.ModelTokenizer` uses this to tokenize a bounded prefix of a long text instead of all of it.
"""

from __future__ import annotations

import re
import string
import unicodedata

# The CJK ideograph blocks of the Basic Multilingual Plane that BERT's normalizer surrounds with spaces
# (`handle_chinese_chars`): Unified Ideographs, Extension A, Compatibility Ideographs.
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0xF900, 0xFAFF))


def _char_class() -> str:
    """A regex character class of characters next to which a word always ends: whitespace, punctuation
    (ASCII punctuation, which includes symbols such as $ and +, and Unicode's P* categories), CJK
    ideographs. Only characters of the Basic Multilingual Plane: Python's `re` matches such a class with a
    bitmap (classes with astral ranges cost 15x more per character). Leaving the astral ones out is safe:
    fewer cut points, never a wrong one."""
    punctuation = {ord(c) for c in string.punctuation}
    punctuation.update(cp for cp in range(0x10000) if unicodedata.category(chr(cp)).startswith("P"))
    parts = [r"\s"]
    parts += [re.escape(chr(cp)) for cp in sorted(punctuation)]
    parts += [f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in CJK_RANGES]
    return "[" + "".join(parts) + "]"


BOUNDARY_CHARACTER = re.compile(_char_class())
PREVIOUS_CUT_WINDOW = 64  # characters `previous_cut` looks back through first


def supports_prefixes(config: dict) -> bool:
    """Whether a tokenizer (its tokenizer.json, parsed) is the BERT pipeline this module reasons about:
    BERT's normalizer (or none), BERT's pre-tokenizer, WordPiece, and added tokens matched literally (not
    normalized, no stripping of the whitespace around them, not restricted to single words)."""
    normalizer = (config.get("normalizer") or {}).get("type", "BertNormalizer")
    pre_tokenizer = (config.get("pre_tokenizer") or {}).get("type")
    model = (config.get("model") or {}).get("type")
    literal = all(
        not (t.get("normalized") or t.get("lstrip") or t.get("rstrip") or t.get("single_word"))
        for t in config.get("added_tokens", [])
    )
    return (
        normalizer == "BertNormalizer"
        and pre_tokenizer == "BertPreTokenizer"
        and model == "WordPiece"
        and literal
    )


class WordBoundaries:
    """Cut points at word boundaries that no added token crosses."""

    def __init__(self, added_tokens: list[str]):
        self._added = [t for t in added_tokens if len(t) > 1]

    def _inside_added_token(self, text: str, cut: int) -> bool:
        for token in self._added:
            window = text[max(0, cut - len(token) + 1) : cut + len(token) - 1]
            if token in window:
                return True
        return False

    def next_cut(self, text: str, start: int) -> int:
        """The first cut at or after `start` (a position between two characters, 0 < cut < len(text)) that
        is a word boundary; the text's length when there is none."""
        candidate = max(1, start)
        while candidate < len(text):
            found = BOUNDARY_CHARACTER.search(text, candidate - 1)
            if found is None:
                break
            k = found.start()  # the first boundary character at candidate - 1 or later
            for cut in (k, k + 1):  # before it and after it
                if candidate <= cut < len(text) and not self._inside_added_token(text, cut):
                    return cut
            candidate = k + 2
        return len(text)

    def previous_cut(self, text: str, end: int) -> int:
        """The last cut at or before `end` (0 < cut < len(text)) that is a word boundary; 0 when there is
        none. Looks back through windows that double, so its cost follows the distance to the cut."""
        candidate = min(end, len(text) - 1)
        hi, step = candidate + 1, PREVIOUS_CUT_WINDOW
        while hi > 0 and candidate > 0:
            lo = max(0, hi - step)
            for k in reversed([m.start() for m in BOUNDARY_CHARACTER.finditer(text, lo, hi)]):
                for cut in (k + 1, k):  # after it and before it
                    if 0 < cut <= candidate and not self._inside_added_token(text, cut):
                        return cut
            hi, step = lo, 2 * step
        return 0
