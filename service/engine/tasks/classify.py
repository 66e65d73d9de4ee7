"""Classify: the classifier head's logits -> softmax (single-label) or sigmoid (multi-label), best first."""

from __future__ import annotations

import numpy as np

from bertserve.service.engine.tasks.fill_mask import softmax


def label_scores(logits: np.ndarray, problem_type: str, raw_scores: bool) -> np.ndarray:
    """logits (L,) -> scores (L,): raw logits, sigmoid for multi-label, softmax otherwise."""
    values = logits.astype(np.float64)
    if raw_scores or problem_type == "regression":
        scores = values
    elif problem_type == "multi_label_classification":
        scores = 1.0 / (1.0 + np.exp(-values))
    else:
        scores = softmax(values)
    return scores.astype(np.float32)


def ranked(scores: np.ndarray, top_k: int) -> list[tuple[int, float]]:
    """(label index, score) best first, the first `top_k` (0 = all); ties keep label order."""
    order = np.argsort(-scores, kind="stable")
    if top_k:
        order = order[:top_k]
    return [(int(i), float(scores[i])) for i in order]
