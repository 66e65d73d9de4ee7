"""FillMask: gather the hidden states at mask positions, run the MLM head only on those rows, softmax,
top-k per mask."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MaskPrediction:
    """The best candidates for one mask token of one input, best first (what FillMask answers per mask)."""

    position: int  # index of the mask among the input's tokens (special tokens included)
    token_ids: np.ndarray  # (k,) int
    tokens: list[str]  # (k,) vocabulary tokens
    scores: np.ndarray  # (k,) float32 softmax probabilities
    sequences: list[str] | None  # (k,) the input with this mask filled by each candidate; None if not asked


@dataclass(frozen=True)
class MaskTop:
    position: int  # token index of the mask in the input
    token_ids: np.ndarray  # (k,) best first
    scores: np.ndarray  # (k,) softmax probabilities


def mask_positions(ids: np.ndarray, mask_token_id: int) -> np.ndarray:
    return np.flatnonzero(ids == mask_token_id)


def gather_mask_states(hidden: np.ndarray, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """hidden (B, T, H); rows, positions (N,) -> (N, H): the hidden state at each mask."""
    return np.ascontiguousarray(hidden[rows, positions])


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """logits (N, V) -> (ids (N, k), probabilities (N, k)), best first; ties broken by lower id."""
    probs = softmax(logits.astype(np.float64))
    k = min(k, probs.shape[-1])
    part = np.argpartition(-probs, k - 1, axis=-1)[:, :k]
    part_scores = np.take_along_axis(probs, part, axis=-1)
    order = np.lexsort((part, -part_scores), axis=-1)
    ids = np.take_along_axis(part, order, axis=-1)
    return ids, np.take_along_axis(part_scores, order, axis=-1).astype(np.float32)
