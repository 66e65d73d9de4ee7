"""Classify: the classifier head's logits -> softmax (single-label) or sigmoid (multi-label), best first; a
one-label model (a cross-encoder) -> its activation of the one logit (sigmoid unless the manifest says)."""

from __future__ import annotations

import numpy as np

from bertserve.service.engine.tasks.fill_mask import softmax


def one_label_activation(classify) -> str | None:
    """A ClassifyTask's activation of its one logit: the CrossEncoder's own (manifest `cross_encoder`),
    else the raw value for a regression model (as Classify always answered it), else sigmoid
    (sentence-transformers' default for one label); None with several labels."""
    if classify is None or len(classify.id2label) != 1:
        return None
    if classify.cross_encoder:
        return classify.cross_encoder.activation
    return "identity" if classify.problem_type == "regression" else "sigmoid"


def sigmoid(values: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * values))  # no overflow warning for large negative logits


def label_scores(
    logits: np.ndarray, problem_type: str, raw_scores: bool, activation: str | None = None
) -> np.ndarray:
    """logits (L,) -> scores (L,): raw logits, the one-label `activation`, sigmoid for multi-label,
    softmax otherwise."""
    values = logits.astype(np.float64)
    if raw_scores or activation == "identity" or (activation is None and problem_type == "regression"):
        scores = values
    elif activation == "sigmoid" or problem_type == "multi_label_classification":
        scores = sigmoid(values)
    else:
        scores = softmax(values)
    return scores.astype(np.float32)


def ranked(scores: np.ndarray, top_k: int) -> list[tuple[int, float]]:
    """(label index, score) best first, the first `top_k` (0 = all); ties keep label order."""
    order = np.argsort(-scores, kind="stable")
    if top_k:
        order = order[:top_k]
    return [(int(i), float(scores[i])) for i in order]
