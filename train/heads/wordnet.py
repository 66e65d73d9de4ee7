"""WordNet 3.0 noun synsets, read from Debian's `wordnet-base` package (`/usr/share/wordnet/data.noun`).

Each data line of `data.noun` is ``offset lex_filenum ss_type w_cnt word lex_id ... | gloss``: the second
field indexes the lexicographer files (`lexnames(5WN)`; Debian ships the man page, not the `lexnames` file,
so the noun part of the table is written out below). A gloss is a definition followed by optional
quoted examples: ``a mark indicating that ...; "as he called the role he put a check mark ..."``.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

WORDNET_DIR_ENV = "BERTSERVE_WORDNET_DIR"
DEFAULT_WORDNET_DIR = Path("/usr/share/wordnet")

# lex_filenum -> lexicographer file name, the noun files of lexnames(5WN) (numbers 03 to 28).
NOUN_LEXNAMES: dict[int, str] = {
    3: "noun.Tops",
    4: "noun.act",
    5: "noun.animal",
    6: "noun.artifact",
    7: "noun.attribute",
    8: "noun.body",
    9: "noun.cognition",
    10: "noun.communication",
    11: "noun.event",
    12: "noun.feeling",
    13: "noun.food",
    14: "noun.group",
    15: "noun.location",
    16: "noun.motive",
    17: "noun.object",
    18: "noun.person",
    19: "noun.phenomenon",
    20: "noun.plant",
    21: "noun.possession",
    22: "noun.process",
    23: "noun.quantity",
    24: "noun.relation",
    25: "noun.shape",
    26: "noun.state",
    27: "noun.substance",
    28: "noun.time",
}

_QUOTED = re.compile(r'"([^"]*)"')


class WordNetMissing(FileNotFoundError):
    """The WordNet database is not installed (Debian: `apt-get install wordnet-base`)."""


@dataclass(frozen=True)
class Synset:
    offset: int  # byte offset in data.noun: WordNet's stable synset id
    lexname: str  # e.g. "noun.animal"
    words: tuple[str, ...]  # lemmas, underscores turned into spaces
    definition: str
    examples: tuple[str, ...]


def wordnet_dir() -> Path:
    return Path(os.environ.get(WORDNET_DIR_ENV, DEFAULT_WORDNET_DIR))


def split_gloss(gloss: str) -> tuple[str, tuple[str, ...]]:
    """`definition; "example one"; "example two"` -> (definition, examples)."""
    first_quote = gloss.find('"')
    definition = gloss if first_quote < 0 else gloss[:first_quote]
    definition = definition.strip().rstrip(";").strip()
    examples = tuple(e.strip() for e in _QUOTED.findall(gloss) if e.strip())
    return definition, examples


def parse_data_line(line: str) -> Synset | None:
    """One line of data.noun -> Synset; None for the license header (lines starting with spaces)."""
    if line.startswith(" ") or "|" not in line:
        return None
    head, _, gloss = line.partition("|")
    fields = head.split()
    offset, lex_filenum, word_count = int(fields[0]), int(fields[1]), int(fields[3], 16)
    words = tuple(fields[4 + 2 * i].replace("_", " ") for i in range(word_count))
    definition, examples = split_gloss(gloss)
    return Synset(offset, NOUN_LEXNAMES[lex_filenum], words, definition, examples)


def load_noun_synsets(directory: Path | None = None) -> list[Synset]:
    """All noun synsets in file order (sorted by offset)."""
    path = Path(directory or wordnet_dir()) / "data.noun"
    if not path.is_file():
        raise WordNetMissing(
            f"{path} not found: install Debian's wordnet-base (apt-get install wordnet-base)"
        )
    synsets = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            synset = parse_data_line(line)
            if synset is not None and synset.definition:
                synsets.append(synset)
    return synsets


def split_of(offset: int, held_out_percent: int = 10) -> str:
    """Deterministic train/test assignment of a synset, stable across machines and Python versions."""
    bucket = int.from_bytes(hashlib.sha256(f"wn30-noun-{offset}".encode()).digest()[:4], "big") % 100
    return "test" if bucket < held_out_percent else "train"
