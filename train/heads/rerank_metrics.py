"""Ranking figures over fixed candidate lists with one relevant document each, and the BM25 baseline.

MRR@10: 1/rank of the relevant document when it ranks in the first 10, else 0. nDCG@10 with one relevant
document (binary gain): 1/log2(rank + 1) within the first 10, else 0 (the ideal DCG is 1). Equal scores
rank the lower index first, as the Rerank RPC does; the lists are in a seeded random order, so a tie (BM25
with no shared word) is a fair draw.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

CUTOFF = 10
_WORD = re.compile(r"[a-z0-9]+")


def rank_of_relevant(scores: np.ndarray, relevant: int) -> int:
    """1-based rank of `relevant` under descending scores, equal scores in index order."""
    above = (scores > scores[relevant]).sum() + (scores[:relevant] == scores[relevant]).sum()
    return int(above) + 1


def ranks_of(score_lists: Sequence[np.ndarray], relevant: Sequence[int]) -> np.ndarray:
    """The relevant document's rank in each list."""
    return np.array([rank_of_relevant(s, r) for s, r in zip(score_lists, relevant, strict=True)])


def reciprocal_ranks(score_lists: Sequence[np.ndarray], relevant: Sequence[int]) -> np.ndarray:
    """Per list, 1/rank of the relevant document within the cutoff, else 0 (MRR@10 is their mean)."""
    ranks = ranks_of(score_lists, relevant)
    return np.where(ranks <= CUTOFF, 1.0 / ranks, 0.0)


def per_list(values: np.ndarray, lists: Sequence) -> list[np.ndarray]:
    """`values` of every list's documents, in order, cut back into one array per list."""
    bounds = np.cumsum([0] + [len(t.documents) for t in lists])
    return [values[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def ranking_figures(score_lists: Sequence[np.ndarray], relevant: Sequence[int]) -> dict[str, float]:
    ranks = ranks_of(score_lists, relevant)
    within = ranks <= CUTOFF
    return {
        "mrr@10": float(np.where(within, 1.0 / ranks, 0.0).mean()),
        "ndcg@10": float(np.where(within, 1.0 / np.log2(ranks + 1), 0.0).mean()),
        "recall@1": float((ranks == 1).mean()),
    }


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class Bm25:
    """Okapi BM25 (k1 1.2, b 0.75) with document frequencies and the average length taken over a corpus
    (all WordNet noun definitions), scoring any texts against a query."""

    def __init__(self, corpus: Iterable[str], k1: float = 1.2, b: float = 0.75):
        self.k1, self.b = k1, b
        document_frequency: Counter[str] = Counter()
        lengths = []
        for text in corpus:
            tokens = words(text)
            lengths.append(len(tokens))
            document_frequency.update(set(tokens))
        self.documents = len(lengths)
        self.average_length = sum(lengths) / max(1, len(lengths))
        self.document_frequency = document_frequency

    def idf(self, term: str) -> float:
        df = self.document_frequency.get(term, 0)
        return math.log(1.0 + (self.documents - df + 0.5) / (df + 0.5))

    def scores(self, query: str, documents: Sequence[str]) -> np.ndarray:
        terms = words(query)
        out = np.zeros(len(documents))
        for i, document in enumerate(documents):
            tokens = words(document)
            counts = Counter(tokens)
            norm = self.k1 * (1 - self.b + self.b * len(tokens) / self.average_length)
            out[i] = sum(
                self.idf(t) * counts[t] * (self.k1 + 1) / (counts[t] + norm) for t in terms if t in counts
            )
        return out
