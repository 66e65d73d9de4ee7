"""Sparse embeddings (SPLADE): the MLM head on every token's hidden state; per input and vocabulary id, the
max over its tokens (special tokens included) of log(1 + relu(logit)); the ids above a threshold."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# The most logits one run of the MLM head produces (rows x vocabulary x 4 bytes): the head runs on a batch's
# tokens in pieces of this many bytes of output, so its memory is bounded whatever the batch holds.
SPARSE_LOGITS_BYTES = 16 * 1024 * 1024


def piece_rows(vocab_size: int) -> int:
    """Hidden states per MLM-head run under SPARSE_LOGITS_BYTES (at least one)."""
    return max(1, SPARSE_LOGITS_BYTES // (4 * vocab_size))


def splade_weights(
    head: Callable[[np.ndarray], np.ndarray], states: list[np.ndarray], vocab_size: int
) -> np.ndarray:
    """`head`: hidden states (P, H) -> logits (P, V); `states`: per input its tokens' hidden states (T_i, H)
    -> (inputs, V) float32 weights. max over tokens of log1p(relu(x)) is log1p(relu(max over tokens of x))."""
    flat = np.concatenate(states)  # (N, H): every input's tokens in order
    owners = np.repeat(np.arange(len(states)), [len(s) for s in states])  # (N,)
    best = np.full((len(states), vocab_size), -np.inf, dtype=np.float32)  # (inputs, V)
    step = piece_rows(vocab_size)
    for start in range(0, len(flat), step):
        logits = head(np.ascontiguousarray(flat[start : start + step], dtype=np.float32))  # (P, V)
        mine = owners[start : start + step]
        starts = np.flatnonzero(np.r_[True, mine[1:] != mine[:-1]])  # each owner's first row in the piece
        who = mine[starts]
        best[who] = np.maximum(best[who], np.maximum.reduceat(logits, starts, axis=0))
    return np.log1p(np.maximum(best, 0))


def above(weights: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """weights (V,) -> (ids (K,) int64 ascending, their weights (K,) float32) with weight > threshold."""
    ids = np.flatnonzero(weights > threshold).astype(np.int64)
    return ids, weights[ids].astype(np.float32)
