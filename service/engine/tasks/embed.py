"""Embed: the graph's pooled `sentence_embedding` (cut to Matryoshka dimensions, optionally L2-normalized),
the token-level `last_hidden_state` rows, and SPLADE weights over the MLM head (service/engine/tasks/sparse.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EmbedOutputs:
    """One input's embed answer when more than the dense vector is asked (plain data: pickles between the
    engine and a front process, its arrays out of band). A dense-only row's value is the vector itself."""

    dense: (
        np.ndarray | None
    )  # (D,) float32: cut to the call's dimensions, normalized when asked; None: not asked
    tokens: np.ndarray | None  # (T, H) float32: last_hidden_state of the input's T tokens (special included)
    sparse: tuple[np.ndarray, np.ndarray] | None  # (ids (K,) int64 ascending, weights (K,) float32)


def finish_embeddings(
    pooled: np.ndarray, normalize: np.ndarray, dimensions: np.ndarray | None = None
) -> list:
    """pooled (B, H) float32; normalize (B,) bool; dimensions (B,) int (0: all H) -> B vectors float32, each
    cut to its first `dimensions` values THEN L2-normalized when its row asks (sentence-transformers'
    truncate_dim with normalize_embeddings)."""
    out = pooled.astype(np.float32, copy=True)
    sizes = (
        np.full(len(out), out.shape[1])
        if dimensions is None
        else np.where(dimensions > 0, dimensions, out.shape[1])
    )
    vectors: list[np.ndarray | None] = [None] * len(out)
    for size in np.unique(sizes):
        chosen = np.flatnonzero(sizes == size)
        whole = len(chosen) == len(out)  # the usual batch: a view, no gathered copies
        cut = out[:, :size] if whole else out[chosen, :size]  # (n, size)
        rows = normalize[chosen]
        if rows.any():  # in place, in few whole-array steps (each may let go of the GIL); every row's norm
            # taken alike, so a vector never depends on whether its batch-mates normalize
            norms = np.maximum(np.sqrt(np.einsum("ij,ij->i", cut, cut)), 1e-12)[:, None]
            if rows.all():
                cut /= norms
            else:
                cut[rows] /= norms[rows]
        if whole:
            return list(cut)
        for i, row in enumerate(chosen):
            vectors[row] = cut[i]
    return vectors
