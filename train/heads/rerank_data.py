"""Reranking data made from WordNet 3.0 nouns: a query per synset, and a fixed candidate list of glosses.

- Query: the synset's first example sentence ("the dog barked all night"); without one, its lemmas joined
  ("dog, domestic dog, Canis familiaris") when it has two or more; a synset with one lemma and no example
  gives no query (its gloss is still a candidate of others).
- Candidates: the synset's definition (the one relevant document), hard negatives (the definitions of the
  other senses of its lemmas, of its hypernyms, hyponyms and sisters), then random definitions, deduplicated
  by text, in a seeded random order.
- Split: `split_of` of the query's synset. A training list holds only training synsets, so a held-out
  synset is never a query, a positive or a negative in training; a held-out list may hold any synset's
  definition as a negative.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertserve.train.heads.wordnet import WordNetMissing, split_gloss, split_of, wordnet_dir

HYPERNYM_POINTERS = ("@", "@i")
HYPONYM_POINTERS = ("~", "~i")


@dataclass(frozen=True)
class NounSense:
    offset: int
    words: tuple[str, ...]
    definition: str
    examples: tuple[str, ...]
    hypernyms: tuple[int, ...]
    hyponyms: tuple[int, ...]


@dataclass(frozen=True)
class RankingList:
    query: str
    offset: int  # the query's synset
    documents: tuple[str, ...]
    relevant: int  # index of the relevant document in `documents`


@dataclass(frozen=True)
class ListSizes:
    queries: int  # lists to draw (fewer when fewer synsets give queries)
    candidates: int  # documents per list
    hard: int  # at most this many hard negatives per list
    seed: int


def parse_sense(line: str) -> NounSense | None:
    """One line of data.noun -> NounSense with its hypernym/hyponym pointers; None for the license header."""
    if line.startswith(" ") or "|" not in line:
        return None
    head, _, gloss = line.partition("|")
    fields = head.split()
    word_count = int(fields[3], 16)
    words = tuple(fields[4 + 2 * i].replace("_", " ") for i in range(word_count))
    at = 4 + 2 * word_count
    pointers = [fields[at + 1 + 4 * i : at + 5 + 4 * i] for i in range(int(fields[at]))]
    definition, examples = split_gloss(gloss)
    return NounSense(
        int(fields[0]),
        words,
        definition,
        examples,
        tuple(int(p[1]) for p in pointers if p[0] in HYPERNYM_POINTERS and p[2] == "n"),
        tuple(int(p[1]) for p in pointers if p[0] in HYPONYM_POINTERS and p[2] == "n"),
    )


def load_senses(directory: Path | None = None) -> dict[int, NounSense]:
    path = Path(directory or wordnet_dir()) / "data.noun"
    if not path.is_file():
        raise WordNetMissing(
            f"{path} not found: install Debian's wordnet-base (apt-get install wordnet-base)"
        )
    senses = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            sense = parse_sense(line)
            if sense is not None and sense.definition:
                senses[sense.offset] = sense
    return senses


def query_of(sense: NounSense) -> str | None:
    if sense.examples:
        return sense.examples[0]
    if len(sense.words) >= 2:
        return ", ".join(sense.words)
    return None


class Relations:
    """Hard-negative neighbours of a synset: other senses of its lemmas, hypernyms, hyponyms, sisters."""

    def __init__(self, senses: dict[int, NounSense]):
        self.senses = senses
        self.by_lemma: dict[str, list[int]] = {}
        for sense in senses.values():
            for word in sense.words:
                self.by_lemma.setdefault(word.lower(), []).append(sense.offset)

    def hard_negatives(self, offset: int) -> tuple[list[int], list[int]]:
        """(other senses of the same lemmas, relatives), each without `offset`, in a stable order."""
        sense = self.senses[offset]
        same_lemma = {o for w in sense.words for o in self.by_lemma.get(w.lower(), ())}
        relatives = set(sense.hypernyms) | set(sense.hyponyms)
        for parent in sense.hypernyms:
            relatives |= set(self.senses[parent].hyponyms) if parent in self.senses else set()
        same_lemma.discard(offset)
        relatives -= same_lemma | {offset}
        keep = self.senses.__contains__
        return sorted(filter(keep, same_lemma)), sorted(filter(keep, relatives))


def build_lists(
    relations: Relations,
    split: str,
    sizes: ListSizes,
    held_out_percent: int = 10,
    not_queries: frozenset[int] = frozenset(),
) -> list[RankingList]:
    """`sizes.queries` ranking lists whose queries come from synsets of `split` ("train" or "test"), none
    of them in `not_queries`."""
    senses = relations.senses
    in_split = [o for o in sorted(senses) if split_of(o, held_out_percent) == split]
    with_query = [o for o in in_split if query_of(senses[o]) is not None and o not in not_queries]
    rng = np.random.default_rng(sizes.seed)
    chosen = sorted(rng.choice(with_query, size=min(sizes.queries, len(with_query)), replace=False).tolist())
    # Negatives of a training list come from training synsets only; held-out lists may use any synset.
    allowed = set(in_split) if split == "train" else set(senses)
    pool = np.array(sorted(allowed))
    lists = []
    for offset in chosen:
        same_lemma, relatives = relations.hard_negatives(offset)
        hard = [o for o in rng.permutation(same_lemma).tolist() if o in allowed]
        hard += [o for o in rng.permutation(relatives).tolist() if o in allowed]
        negatives = _distinct_definitions(senses, offset, hard[: sizes.hard], rng, pool, sizes.candidates - 1)
        documents = [senses[offset].definition] + [senses[o].definition for o in negatives]
        order = rng.permutation(len(documents))
        lists.append(
            RankingList(
                query=query_of(senses[offset]),
                offset=offset,
                documents=tuple(documents[i] for i in order),
                relevant=int(np.flatnonzero(order == 0)[0]),
            )
        )
    return lists


def _distinct_definitions(
    senses: dict[int, NounSense],
    offset: int,
    hard: Sequence[int],
    rng: np.random.Generator,
    pool: np.ndarray,
    count: int,
) -> list[int]:
    """Up to `count` synsets, hard ones first, then random ones from `pool`, no two with the same text."""
    seen, picked = {senses[offset].definition}, []
    for candidate in hard:
        if senses[candidate].definition not in seen:
            seen.add(senses[candidate].definition)
            picked.append(candidate)
    while len(picked) < count:
        candidate = int(pool[rng.integers(len(pool))])
        if senses[candidate].definition not in seen:
            seen.add(senses[candidate].definition)
            picked.append(candidate)
    return picked[:count]
