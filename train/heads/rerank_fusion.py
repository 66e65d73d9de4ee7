"""The default reranker's served score: its logit plus the embedding model's cosine of the same pair.

Each of the two is divided by its spread over training-split pairs whose queries the cross-encoder never
trained on (equal weights, fixed before any measuring: no label chooses them), then one logistic calibration
of their sum (its scale and bias, fitted on the same pairs) makes the score a probability; the calibration
cannot change a ranking. The held-out figures are those of the served computation: the assembled
checkpoint's logits (float16 weights) and the embedding model's normalized mean-pooled embeddings (WordNet's
texts are shorter than any cut).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from bertserve.export.checkpoint import load_checkpoint
from bertserve.export.tokenizer_files import load_tokenizer
from bertserve.train.heads.features import length_batches, pad, tokenize
from bertserve.train.heads.rerank_data import ListSizes, RankingList, Relations, build_lists
from bertserve.train.heads.rerank_metrics import per_list, ranking_figures, reciprocal_ranks
from bertserve.train.heads.rerank_model import mean_pooled, tokenize_pairs

COSINE_MAX_TOKENS = 128  # as the cosine baseline embeds (WordNet's texts are shorter)


@torch.inference_mode()
def pair_logits(model: torch.nn.Module, tokenizer, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """A sequence classifier's one logit per (first, second) pair: (N,) float32."""
    model.eval()
    ids, types = tokenize_pairs(tokenizer, pairs)
    out = np.zeros(len(ids), dtype=np.float32)
    for indices in length_batches([len(i) for i in ids]):
        input_ids, mask = pad([ids[i] for i in indices])
        type_ids, _ = pad([types[i] for i in indices])
        out[indices] = model(input_ids=input_ids, attention_mask=mask, token_type_ids=type_ids)[:, 0].numpy()
    return out


def list_cosines(encoder: torch.nn.Module, tokenizer, lists: Sequence[RankingList]) -> list[np.ndarray]:
    """Per list, the cosine of the query's and each document's embedding, each distinct text embedded once."""
    texts = sorted({t.query for t in lists} | {d for t in lists for d in t.documents})
    row = {text: i for i, text in enumerate(texts)}
    vectors = mean_pooled(encoder, tokenize(tokenizer, texts, max_tokens=COSINE_MAX_TOKENS))
    return [vectors[[row[d] for d in t.documents]] @ vectors[row[t.query]] for t in lists]


def list_logits(model: torch.nn.Module, tokenizer, lists: Sequence[RankingList]) -> list[np.ndarray]:
    return per_list(pair_logits(model, tokenizer, [(t.query, d) for t in lists for d in t.documents]), lists)


def logistic_fit(x: np.ndarray, y: np.ndarray, steps: int = 50) -> tuple[float, float]:
    """(scale, bias) maximizing the likelihood of y ~ sigmoid(scale * x + bias), by Newton's method."""
    design = np.stack([x, np.ones_like(x)], axis=1).astype(np.float64)
    theta = np.zeros(2)
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(design @ theta)))
        gradient = design.T @ (y - p)
        hessian = (design * (p * (1 - p))[:, None]).T @ design + 1e-9 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        theta += step
        if np.abs(step).max() < 1e-10:
            break
    return float(theta[0]), float(theta[1])


def fit_fusion(
    checkpoint_dir: Path,
    base_dir: Path,
    embedding_model: str,
    relations: Relations,
    calibration: ListSizes,
    test: ListSizes,
    held_out_percent: int,
    trained_queries: frozenset[int] = frozenset(),
    log: Callable[[str], None] = print,
) -> dict:
    """The manifest's fusion (weights of the cosine and the logit, bias) and its held-out figures; the
    calibration lists' queries are none of `trained_queries` (the synsets of the training lists)."""
    cross_encoder = load_checkpoint(checkpoint_dir).model
    encoder = load_checkpoint(base_dir).encoder
    tokenizer = load_tokenizer(base_dir)
    fit_lists = build_lists(relations, "train", calibration, held_out_percent, trained_queries)
    cosines, logits = (
        list_cosines(encoder, tokenizer, fit_lists),
        list_logits(cross_encoder, tokenizer, fit_lists),
    )
    cosine_all, logit_all = np.concatenate(cosines), np.concatenate(logits)
    labels = np.concatenate([np.arange(len(t.documents)) == t.relevant for t in fit_lists]).astype(np.float64)
    spreads = {"cosine": float(cosine_all.std()), "logit": float(logit_all.std())}
    means = {"cosine": float(cosine_all.mean()), "logit": float(logit_all.mean())}
    summed = (cosine_all - means["cosine"]) / spreads["cosine"] + (logit_all - means["logit"]) / spreads[
        "logit"
    ]
    scale, bias = logistic_fit(summed, labels)
    fusion = {
        "embedding_model": embedding_model,
        "cosine_weight": scale / spreads["cosine"],
        "logit_weight": scale / spreads["logit"],
        "bias": bias - scale * (means["cosine"] / spreads["cosine"] + means["logit"] / spreads["logit"]),
    }
    log(f"   fusion fitted on {len(fit_lists)} training-split lists: {fusion}")

    held_out = build_lists(relations, "test", test, held_out_percent)
    relevant = [t.relevant for t in held_out]
    cos_lists, logit_lists = (
        list_cosines(encoder, tokenizer, held_out),
        list_logits(cross_encoder, tokenizer, held_out),
    )
    fused = [
        fusion["cosine_weight"] * c + fusion["logit_weight"] * g
        for c, g in zip(cos_lists, logit_lists, strict=True)
    ]
    baseline = reciprocal_ranks(cos_lists, relevant)
    figures = {}
    for name, scores in (("cross_encoder", logit_lists), ("fused", fused)):
        gain = reciprocal_ranks(scores, relevant) - baseline
        figures[name] = ranking_figures(scores, relevant) | {
            "mrr@10_minus_cosine": float(gain.mean()),
            "paired_standard_error": float(gain.std(ddof=1) / np.sqrt(len(gain))),
        }
        log(f"   held-out {name}: MRR@10 {figures[name]['mrr@10']:.4f} ({gain.mean():+.4f} on the cosine)")
    return fusion | {
        "fit": asdict(calibration)
        | {
            "split": "train, no query of the training lists",
            "lists": len(fit_lists),
            "pairs": int(labels.size),
        },
        "held_out": figures,
    }
