"""`bertserve train-reranker`: the default cross-encoder on WordNet, measured against BM25 and the embedding
model's cosine on held-out synsets, over the same candidate lists.

The lower encoder layers stay MiniLM's: their outputs are computed once per pair and cached (OUT/cache), and
each variant trains only the top layers it names (0 = the pooler and classifier alone, on the frozen
encoder). Deterministic: fixed seeds, the hash split of synsets, deterministic torch kernels, fixed threads.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from bertserve import __version__
from bertserve.export.checkpoint import load_checkpoint
from bertserve.export.default_model import DEFAULT_MODEL_NAME
from bertserve.export.heads import reranker as committed
from bertserve.export.tokenizer_files import load_tokenizer
from bertserve.repository import sha256_file
from bertserve.train.heads.rerank_data import ListSizes, RankingList, Relations, build_lists, load_senses
from bertserve.train.heads.rerank_fusion import fit_fusion, list_cosines
from bertserve.train.heads.rerank_metrics import Bm25, per_list, ranking_figures
from bertserve.train.heads.rerank_model import (
    HiddenStates,
    RerankTraining,
    TopModel,
    advance,
    lower_states,
    score,
    tokenize_pairs,
    train_top,
)
from bertserve.train.heads.training import make_deterministic
from bertserve.train.heads.wordnet import wordnet_dir

CACHE_SUBDIR = "cache"
WEIGHTS_SUBDIR = "weights"
CHECKPOINT_SUBDIR = "checkpoint"


@dataclass(frozen=True)
class RerankPlan:
    train: ListSizes = ListSizes(queries=1500, candidates=8, hard=5, seed=1)
    test: ListSizes = ListSizes(queries=300, candidates=20, hard=12, seed=2)
    held_out_percent: int = 10
    variants: tuple[int, ...] = (0, 1)  # trained top layers of each model measured (0: head only)
    chosen: int = 1  # the variant written as the default reranker
    frozen_layers: int = 4  # the cached lower layers: variants may train up to the top 2
    head_only: RerankTraining = RerankTraining(epochs=20, lists_per_batch=16)
    layers: RerankTraining = field(default_factory=RerankTraining)
    progress_every: int = 0  # batches between held-out figures in the log (0: none)
    # training-split lists the fusion with the cosine is fitted on (train/heads/rerank_fusion.py)
    calibration: ListSizes = ListSizes(queries=1000, candidates=20, hard=12, seed=3)
    dropout: float = 0.1
    threads: int = 2


FULL_PLAN = RerankPlan()
# 12 times the lists, the top 4 layers trained: 74 minutes on 2 shared cores (docs/reranker.md).
LARGE_PLAN = RerankPlan(
    train=ListSizes(queries=18000, candidates=8, hard=5, seed=1),
    variants=(4,),
    chosen=4,
    frozen_layers=2,
    layers=RerankTraining(epochs=1, learning_rate=3e-5),
    progress_every=500,
)
QUICK_PLAN = RerankPlan(
    train=ListSizes(queries=120, candidates=8, hard=5, seed=1),
    test=ListSizes(queries=40, candidates=20, hard=12, seed=2),
    variants=(0, 1),
    chosen=1,
    frozen_layers=5,
    layers=RerankTraining(epochs=1),
    calibration=ListSizes(queries=60, candidates=20, hard=12, seed=3),
)


def _pairs(lists: Sequence[RankingList], relevant_first: bool) -> list[tuple[str, str]]:
    pairs = []
    for item in lists:
        documents = list(item.documents)
        if relevant_first:
            documents.insert(0, documents.pop(item.relevant))
        pairs += [(item.query, d) for d in documents]
    return pairs


def _cached_states(cache_dir: Path, base_dir: Path, encoder, tokenizer, pairs, layers, log) -> HiddenStates:
    """Lower-layer states of `pairs`, from OUT/cache when an earlier run computed the same ones."""
    key = hashlib.sha256(json.dumps([sha256_file(base_dir / "model.safetensors"), layers, pairs]).encode())
    path = cache_dir / f"states-{layers}-{key.hexdigest()[:16]}.pt"
    if path.is_file():
        return HiddenStates(torch.load(path))
    started = time.perf_counter()
    states = lower_states(encoder, *tokenize_pairs(tokenizer, pairs), layers)
    cache_dir.mkdir(parents=True, exist_ok=True)
    torch.save(states.states, path)
    log(f"   layers 1-{layers} of {len(pairs)} pairs ({time.perf_counter() - started:.0f} s), cached")
    return states


def _baselines(encoder, tokenizer, senses, test: Sequence[RankingList]) -> dict[str, dict]:
    bm25 = Bm25(s.definition for s in senses.values())
    relevant = [t.relevant for t in test]
    bm25_scores = [bm25.scores(t.query, t.documents) for t in test]
    cosine_scores = list_cosines(encoder, tokenizer, test)
    return {
        "bm25": ranking_figures(bm25_scores, relevant)
        | {"note": "Okapi k1 1.2, b 0.75, idf over all noun definitions"},
        "cosine": ranking_figures(cosine_scores, relevant)
        | {"note": "all-MiniLM-L6-v2 mean-pooled, normalized"},
    }


def _variant(
    encoder, lower: HiddenStates, test_lower: HiddenStates, boundary, k, plan, list_size, log, held_out
):
    """Trains the model with the top `k` layers trained; returns (model, held-out scores, record)."""
    blocks = encoder.encoder.layer[boundary : len(encoder.encoder.layer) - k]
    started = time.perf_counter()
    train_states, test_states = lower, test_lower
    if blocks or k == 0:
        train_states = advance(lower, blocks, cls_only=k == 0)
        test_states = advance(test_lower, blocks, cls_only=k == 0)
    model = TopModel(encoder, k, plan.dropout)
    training = plan.head_only if k == 0 else plan.layers

    def progress(batches: int) -> None:  # a learning curve in the log; nothing is chosen by it
        log(
            f"   after {batches} batches: held-out MRR@10 {held_out(score(model, test_states))['mrr@10']:.4f}"
        )

    train_top(model, train_states, list_size, training, log, progress, plan.progress_every)
    with torch.no_grad():  # measured as shipped: float16 weights
        for p in model.parameters():
            p.copy_(p.half().float())
    scores = score(model, test_states)
    record = {
        "trained_layers": k,
        "trained_parameters": model.trained_parameters(),
        "training": asdict(training),
        "seconds": round(time.perf_counter() - started, 1),
    }
    return model, scores, record


def train_reranker(
    out_dir: Path, base_dir: Path, base_name: str, plan: RerankPlan = FULL_PLAN, log: Callable = print
) -> dict:
    """Trains and measures every variant of the plan; writes OUT/weights (the chosen one, float16, and
    reranker.json) and OUT/checkpoint (assembled); returns the record."""
    out_dir, base_dir = Path(out_dir), Path(base_dir)
    started = time.perf_counter()
    make_deterministic(plan.threads)
    encoder = load_checkpoint(base_dir).encoder
    tokenizer = load_tokenizer(base_dir)
    senses = load_senses()
    relations = Relations(senses)
    train = build_lists(relations, "train", plan.train, plan.held_out_percent)
    test = build_lists(relations, "test", plan.test, plan.held_out_percent)
    log(
        f"-> {len(train)} training lists of {plan.train.candidates}, {len(test)} held-out lists of {plan.test.candidates}"
    )
    figures = _baselines(encoder, tokenizer, senses, test)
    for name in ("bm25", "cosine"):
        log(f"   {name}: MRR@10 {figures[name]['mrr@10']:.4f}, nDCG@10 {figures[name]['ndcg@10']:.4f}")

    boundary = min(plan.frozen_layers, len(encoder.encoder.layer) - max(plan.variants))
    cache_dir = out_dir / CACHE_SUBDIR
    lower = _cached_states(cache_dir, base_dir, encoder, tokenizer, _pairs(train, True), boundary, log)
    test_lower = _cached_states(cache_dir, base_dir, encoder, tokenizer, _pairs(test, False), boundary, log)
    relevant, chosen_state, variants = [t.relevant for t in test], None, {}

    def held_out(scores: np.ndarray) -> dict:
        return ranking_figures(per_list(scores, test), relevant)

    for k in plan.variants:
        log(f"-> cross-encoder, top {k} layers trained ...")
        model, scores, record = _variant(
            encoder, lower, test_lower, boundary, k, plan, plan.train.candidates, log, held_out
        )
        record |= held_out(scores)
        log(f"   MRR@10 {record['mrr@10']:.4f}, nDCG@10 {record['ndcg@10']:.4f} ({record['seconds']:.0f} s)")
        variants[str(k)] = record
        if k == plan.chosen:
            chosen_state = {n: t.half() for n, t in model.trained_state().items()}

    record = {
        "tool": f"bertserve {__version__} train-reranker",
        "base_model": base_name,
        "data": {
            "source": "WordNet 3.0 data.noun (Debian wordnet-base)",
            "sha256": sha256_file(wordnet_dir() / "data.noun"),
            "held_out_percent": plan.held_out_percent,
            "split": "sha256('wn30-noun-<offset>') bucket < held_out_percent -> held out",
            "train": asdict(plan.train) | {"lists": len(train)},
            "test": asdict(plan.test) | {"lists": len(test)},
        },
        "baselines": figures,
        "variants": variants,
        "chosen_layers": plan.chosen,
        "environment": {"torch": torch.__version__, "threads": plan.threads, "machine": platform.machine()},
        "seconds_total": round(time.perf_counter() - started, 1),
    }
    if chosen_state is not None:
        committed.save_weights(out_dir / WEIGHTS_SUBDIR, chosen_state, record)
        record = fit_fused_score(out_dir, base_dir, plan, relations, log)
    log(f"-> wrote {out_dir} ({time.perf_counter() - started:.0f} s)")
    return record


def fit_fused_score(
    out_dir: Path, base_dir: Path, plan: RerankPlan, relations: Relations | None = None, log: Callable = print
) -> dict:
    """Fits the fusion of OUT/weights' cross-encoder with the embedding model's cosine and records it in
    OUT/weights/reranker.json; writes OUT/checkpoint; returns the record."""
    weights, checkpoint = Path(out_dir) / WEIGHTS_SUBDIR, Path(out_dir) / CHECKPOINT_SUBDIR
    record = {k: v for k, v in committed.verify_weights(weights).items() if k not in ("fusion", "files")}
    committed.assemble_reranker(base_dir, weights, checkpoint)
    log("-> its logit plus the cosine ...")
    started = time.perf_counter()
    torch.set_num_threads(plan.threads)
    relations = relations or Relations(load_senses())
    trained = ListSizes(**{k: record["data"]["train"][k] for k in ("queries", "candidates", "hard", "seed")})
    trained_queries = frozenset(
        t.offset for t in build_lists(relations, "train", trained, plan.held_out_percent)
    )
    fusion = fit_fusion(
        checkpoint,
        base_dir,
        DEFAULT_MODEL_NAME,
        relations,
        plan.calibration,
        plan.test,
        plan.held_out_percent,
        trained_queries,
        log,
    )
    record["fusion"] = fusion | {"seconds": round(time.perf_counter() - started, 1)}
    committed.rewrite_record(weights, record)
    committed.write_card(checkpoint, record)  # the checkpoint's card names the fused figures
    return record
