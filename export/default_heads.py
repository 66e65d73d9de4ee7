"""The default models beside the encoder all-minilm-l6-v2, described once; `make export-default` and the
Dockerfile export them with `bertserve export-default-heads`.

- wordnet-noun-category: MiniLM, frozen, + the WordNet classifier head (export/heads): a head-only model on
  the encoder model, since its encoder is MiniLM's.
- wordnet-fill-mask: MiniLM + continued masked-LM pretraining (export/pretrain/weights: the encoder layers and
  the MLM head, packed by `bertserve pack-pretrained`). Its trained layers differ from MiniLM's, so it is a
  model of its own; its manifest records the modules it still shares with MiniLM
  (`export.pretraining.shared_with_base`). With `fill_mask_from_heads` it is the earlier WordNet MLM head on
  the frozen encoder, head-only like the classifier.
- wordnet-reranker: a cross-encoder (one relevance score per query/document pair), MiniLM + the tensors
  `bertserve train-reranker` trained (export/heads/weights/reranker.safetensors): head-only on the encoder
  model when only the pooler and classifier trained, else a model of its own (its top layers differ); its
  score adds the encoder model's cosine when the record fitted a fusion (train/heads/rerank_fusion.py).
  Exported only when its record shows that served score beats both baselines (BM25 and the encoder's
  cosine) on held-out MRR@10 and nDCG@10: Rerank with no model named takes the first cross-encoder, so a
  weaker one would make the default ranking worse than the cosine it replaces.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bertserve.export.default_model import DEFAULT_MODEL_NAME, default_checkpoint_dir
from bertserve.export.heads.assemble import (
    CLASSIFIER_NAME,
    COMMITTED_HEADS_DIR,
    FILL_MASK_NAME,
    assemble_classifier,
    assemble_fill_mask,
)
from bertserve.export.heads.reranker import (
    RECORD_FILE,
    RERANKER_NAME,
    assemble_reranker,
    beats_baselines,
    fusion_of,
    verify_weights,
)
from bertserve.export.pipeline import export_model
from bertserve.export.pretrain import output as pretrained
from bertserve.repository import CosineFusion


@dataclass(frozen=True)
class HeadModel:
    name: str
    assemble: Callable[[Path, Path], Path]  # (base checkpoint, out dir) -> checkpoint directory
    on_encoder: bool  # head-only on the default encoder model (its encoder is the base's, unchanged)
    fusion: CosineFusion | None = None  # a reranker whose score adds the encoder model's cosine


def default_head_models(fill_mask_from_heads: bool = False) -> list[HeadModel]:
    fill_mask = (
        HeadModel(FILL_MASK_NAME, lambda base, out: assemble_fill_mask(base, COMMITTED_HEADS_DIR, out), True)
        if fill_mask_from_heads
        else HeadModel(
            FILL_MASK_NAME, lambda base, out: pretrained.assemble(base, pretrained.COMMITTED_DIR, out), False
        )
    )
    return [
        HeadModel(
            CLASSIFIER_NAME, lambda base, out: assemble_classifier(base, COMMITTED_HEADS_DIR, out), True
        ),
        fill_mask,
        *reranker_models(COMMITTED_HEADS_DIR),
    ]


def reranker_models(weights_dir: Path, log: Callable[[str], None] = print) -> list[HeadModel]:
    """The reranker, when its recorded figures beat both baselines; else none (with a line saying why)."""
    if not (Path(weights_dir) / RECORD_FILE).is_file():
        log(f"{RERANKER_NAME}: not exported: no trained weights in {weights_dir} (make train-reranker)")
        return []
    record = verify_weights(weights_dir)
    if shortfall := beats_baselines(record):
        log(f"{RERANKER_NAME}: not exported: {shortfall} (docs/reranker.md)")
        return []
    head_only = record["chosen_layers"] == 0
    assemble = lambda base, out: assemble_reranker(base, weights_dir, out)  # noqa: E731
    return [HeadModel(RERANKER_NAME, assemble, head_only, fusion_of(record))]


def export_default_heads(
    repo: Path, fill_mask_from_heads: bool = False, log: Callable[[str], None] = print
) -> list[Path]:
    """Exports each default head model that REPO has no version of yet (after the encoder model, which
    the head-only ones run on); returns the version directories written."""
    repo, base, written = Path(repo), default_checkpoint_dir(), []
    with tempfile.TemporaryDirectory(prefix="bertserve-heads-") as scratch:
        for model in default_head_models(fill_mask_from_heads):
            if any((repo / model.name).glob("*/manifest.json")):
                log(f"{model.name}: already in {repo}")
                continue
            checkpoint = model.assemble(base, Path(scratch) / model.name)
            encoder = DEFAULT_MODEL_NAME if model.on_encoder else None
            written.append(
                export_model(checkpoint, repo, name=model.name, encoder=encoder, log=log, fusion=model.fusion)
            )
    return written
