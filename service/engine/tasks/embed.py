"""Embed: the graph's pooled `sentence_embedding`, optionally L2-normalized."""

from __future__ import annotations

import numpy as np


def finish_embeddings(pooled: np.ndarray, normalize: np.ndarray) -> np.ndarray:
    """pooled (B, H) float32; normalize (B,) bool -> (B, H) float32 with the chosen rows L2-normalized."""
    out = pooled.astype(np.float32, copy=True)
    if normalize.any():
        norms = np.linalg.norm(out[normalize], axis=1, keepdims=True)
        out[normalize] = out[normalize] / np.maximum(norms, 1e-12)
    return out
