"""Trains both heads on WordNet with the encoder frozen, measures them on held-out synsets, and writes
the head files and the assembled checkpoint directories.

Deterministic: fixed seeds, a hash-based train/test split of synsets, `torch.use_deterministic_algorithms`,
a fixed thread count. Bit-identical results are promised for the same machine type and library versions
(the float kernels differ between CPU instruction sets).
"""

from __future__ import annotations

import hashlib
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from bertserve import __version__
from bertserve.export.checkpoint import load_checkpoint
from bertserve.export.heads.assemble import assemble_checkpoints, save_heads
from bertserve.export.tokenizer_files import load_tokenizer, special_tokens
from bertserve.repository import sha256_file
from bertserve.train.heads import classifier, mlm
from bertserve.train.heads.features import cls_features, masked_features, tokenize
from bertserve.train.heads.wordnet import Synset, load_noun_synsets, split_of, wordnet_dir

HEADS_SUBDIR = "heads"
CHECKPOINTS_SUBDIR = "checkpoints"


@dataclass(frozen=True)
class HeadsPlan:
    synset_stride: int = 1  # every n-th synset of data.noun (1 = all 82k)
    held_out_percent: int = 10
    classifier: classifier.ClassifierTraining = field(default_factory=classifier.ClassifierTraining)
    mlm: mlm.MlmTraining = field(default_factory=mlm.MlmTraining)
    mask_seed: int = 0
    threads: int = 2


FULL_PLAN = HeadsPlan()
QUICK_PLAN = HeadsPlan(
    synset_stride=20,
    classifier=classifier.ClassifierTraining(epochs=30),
    mlm=mlm.MlmTraining(epochs=3),
)


def make_deterministic(threads: int) -> None:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)


def _gloss_texts(synsets: Sequence[Synset]) -> list[str]:
    """Definitions and examples, each a text of its own, for the masked-LM head."""
    return [text for s in synsets for text in (s.definition, *s.examples)]


def _classifier_part(encoder, tokenizer, labels, train, test, plan, log) -> tuple[dict, dict]:
    label_ids = {name: i for i, name in enumerate(labels)}
    started = time.perf_counter()
    x_train = cls_features(encoder, tokenize(tokenizer, [s.definition for s in train]))
    x_test = cls_features(encoder, tokenize(tokenizer, [s.definition for s in test]))
    y_train = np.array([label_ids[s.lexname] for s in train])
    y_test = np.array([label_ids[s.lexname] for s in test])
    log(f"   [CLS] features of {len(train) + len(test)} definitions ({time.perf_counter() - started:.0f} s)")
    started = time.perf_counter()
    head = classifier.train_classifier_head(
        encoder.config, x_train, y_train, len(labels), encoder.pooler, plan.classifier, log
    )
    accuracy = float((classifier.predict(head, x_test) == y_test).mean())
    majority = float((y_test == np.bincount(y_train).argmax()).mean())
    log(f"   classifier: held-out accuracy {accuracy:.4f} (majority class {majority:.4f})")
    record = {
        "labels": labels,
        "training": asdict(plan.classifier),
        "train_examples": len(train),
        "held_out": {"examples": len(test), "accuracy": accuracy, "majority_class_accuracy": majority},
        "seconds": {"train": round(time.perf_counter() - started, 1)},
    }
    return classifier.head_state(head), record


def _mlm_part(encoder, tokenizer, mask_token_id, train, test, plan, log) -> tuple[dict, dict]:
    started = time.perf_counter()
    rng = np.random.default_rng(plan.mask_seed)
    train_ids, train_targets = mlm.mask_tokens(tokenize(tokenizer, _gloss_texts(train)), mask_token_id, rng)
    test_ids, test_targets = mlm.mask_tokens(tokenize(tokenizer, _gloss_texts(test)), mask_token_id, rng)
    x_train = masked_features(encoder, train_ids, mask_token_id)
    x_test = masked_features(encoder, test_ids, mask_token_id)
    log(f"   features at {len(x_train) + len(x_test)} masks ({time.perf_counter() - started:.0f} s)")
    started = time.perf_counter()
    word_embeddings = encoder.embeddings.word_embeddings.weight
    head = mlm.train_mlm_head(encoder.config, word_embeddings, x_train, train_targets, plan.mlm, log)
    top = mlm.topk_accuracy(head, x_test, test_targets)
    unigram = mlm.unigram_accuracy(train_targets, test_targets)
    log(
        f"   fill-mask: held-out top-1 {top[1]:.4f}, top-5 {top[5]:.4f} (unigram {unigram[1]:.4f}, {unigram[5]:.4f})"
    )
    record = {
        "training": asdict(plan.mlm),
        "mask_rate": mlm.MASK_RATE,
        "train_texts": len(train_ids),
        "train_masks": len(x_train),
        "held_out": {
            "texts": len(test_ids),
            "masks": len(x_test),
            "top1": top[1],
            "top5": top[5],
            "unigram_top1": unigram[1],
            "unigram_top5": unigram[5],
        },
        "seconds": {"train": round(time.perf_counter() - started, 1)},
    }
    return mlm.head_state(head), record


def train_heads(
    out_dir: Path,
    base_dir: Path,
    base_name: str,
    plan: HeadsPlan = FULL_PLAN,
    log: Callable[[str], None] = print,
) -> dict:
    """Trains, measures and writes OUT/heads/ (head files + heads.json) and OUT/checkpoints/{classifier,
    fill-mask}; returns the heads.json record."""
    out_dir, base_dir = Path(out_dir), Path(base_dir)
    started = time.perf_counter()
    make_deterministic(plan.threads)
    checkpoint = load_checkpoint(base_dir)
    encoder = checkpoint.encoder
    tokenizer = load_tokenizer(base_dir)
    mask_token_id = special_tokens(base_dir, tokenizer).mask_token_id
    synsets = load_noun_synsets()[:: plan.synset_stride]
    train = [s for s in synsets if split_of(s.offset, plan.held_out_percent) == "train"]
    test = [s for s in synsets if split_of(s.offset, plan.held_out_percent) == "test"]
    labels = sorted({s.lexname for s in synsets})
    log(f"-> WordNet nouns: {len(train)} synsets to train on, {len(test)} held out, {len(labels)} categories")

    log("-> classifier head (pooler + classifier) ...")
    classifier_state, classifier_record = _classifier_part(encoder, tokenizer, labels, train, test, plan, log)
    log("-> masked-LM head ...")
    mlm_state, mlm_record = _mlm_part(encoder, tokenizer, mask_token_id, train, test, plan, log)

    record = {
        "tool": f"bertserve {__version__} train-heads",
        "base_model": base_name,
        "data": {
            "source": "WordNet 3.0 data.noun (Debian wordnet-base)",
            "sha256": sha256_file(wordnet_dir() / "data.noun"),
            "synset_stride": plan.synset_stride,
            "held_out_percent": plan.held_out_percent,
            "split": "sha256('wn30-noun-<offset>') bucket < held_out_percent -> held out",
        },
        "classifier": classifier_record,
        "fill_mask": mlm_record,
        "environment": {
            "torch": torch.__version__,
            "threads": plan.threads,
            "machine": platform.machine(),
        },
        "seconds_total": round(time.perf_counter() - started, 1),
    }
    save_heads(out_dir / HEADS_SUBDIR, classifier_state, mlm_state, record)
    assemble_checkpoints(base_dir, out_dir / CHECKPOINTS_SUBDIR, out_dir / HEADS_SUBDIR)
    log(
        f"-> wrote {out_dir / HEADS_SUBDIR} and {out_dir / CHECKPOINTS_SUBDIR} ({record['seconds_total']:.0f} s)"
    )
    return record


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over names and raw bytes: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].contiguous().numpy().tobytes())
    return digest.hexdigest()
