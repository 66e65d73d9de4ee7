"""The masked-LM head (`cls.predictions`) trained on a frozen encoder's hidden states at [MASK] positions.

Head: transform (dense, GELU, LayerNorm) -> decoder tied to the frozen word embeddings -> + bias, as
Hugging Face's BertForMaskedLM has it. Masking: 15% of the wordpieces of each text (at least one), each
replaced by [MASK] (no 80/10/10: the server's fill-mask only ever sees [MASK], and a frozen encoder gains
nothing from the random/kept 20%). The bias starts at the log unigram frequency of the training targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from bertserve.export.model import BertConfig, BertLMPredictionHead

MASK_RATE = 0.15


@dataclass(frozen=True)
class MlmTraining:
    epochs: int = 4
    batch_size: int = 512
    learning_rate: float = 5e-3
    weight_decay: float = 0.01
    seed: int = 0


def mask_tokens(
    id_lists: Sequence[Sequence[int]], mask_token_id: int, rng: np.random.Generator, rate: float = MASK_RATE
) -> tuple[list[list[int]], np.ndarray]:
    """Masks wordpieces between [CLS] and [SEP]: (masked id lists, targets in text-then-position order)."""
    masked, targets = [], []
    for ids in id_lists:
        ids = list(ids)
        inner = len(ids) - 2
        if inner <= 0:
            masked.append(ids)
            continue
        chosen = np.flatnonzero(rng.random(inner) < rate) + 1
        if chosen.size == 0:
            chosen = np.array([1 + rng.integers(inner)])
        for position in chosen:
            targets.append(ids[position])
            ids[position] = mask_token_id
        masked.append(ids)
    return masked, np.asarray(targets, dtype=np.int64)


def build_head(config: BertConfig, word_embeddings: torch.Tensor) -> BertLMPredictionHead:
    """A fresh head whose decoder is the (frozen) word embedding matrix (V, C)."""
    head = BertLMPredictionHead(config)
    head.decoder.weight = torch.nn.Parameter(word_embeddings.detach().clone(), requires_grad=False)
    return head


def train_mlm_head(
    config: BertConfig,
    word_embeddings: torch.Tensor,
    features: np.ndarray,
    targets: np.ndarray,
    training: MlmTraining = MlmTraining(),
    log=print,
) -> BertLMPredictionHead:
    """Fits transform + bias on (hidden state at [MASK], original token) pairs."""
    torch.manual_seed(training.seed)
    head = build_head(config, word_embeddings)
    counts = np.bincount(targets, minlength=config.vocab_size).astype(np.float64) + 0.1
    with torch.no_grad():
        head.bias.copy_(torch.from_numpy(np.log(counts / counts.sum())).float())
    x, y = torch.from_numpy(features), torch.from_numpy(targets)
    decayed = [head.transform.dense.weight]  # no decay on biases and LayerNorm
    not_decayed = [p for p in head.parameters() if p.requires_grad and p is not head.transform.dense.weight]
    optimizer = torch.optim.AdamW(
        [
            {"params": decayed, "weight_decay": training.weight_decay},
            {"params": not_decayed, "weight_decay": 0.0},
        ],
        lr=training.learning_rate,
    )
    steps_per_epoch = (len(x) + training.batch_size - 1) // training.batch_size
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, training.learning_rate, total_steps=training.epochs * steps_per_epoch, pct_start=0.1
    )
    generator = torch.Generator().manual_seed(training.seed)
    head.train()
    for epoch in range(training.epochs):
        order = torch.randperm(len(x), generator=generator)
        total = 0.0
        for start in range(0, len(order), training.batch_size):
            batch = order[start : start + training.batch_size]
            loss = F.cross_entropy(head(x[batch]), y[batch])  # logits (B, V)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item() * len(batch)
        log(f"   mlm epoch {epoch + 1}/{training.epochs}: train loss {total / len(x):.3f}")
    head.eval()
    return head


@torch.inference_mode()
def topk_accuracy(
    head: BertLMPredictionHead, features: np.ndarray, targets: np.ndarray, ks=(1, 5), batch_size: int = 1024
) -> dict[int, float]:
    hits = dict.fromkeys(ks, 0)
    for start in range(0, len(features), batch_size):
        logits = head(torch.from_numpy(features[start : start + batch_size]))  # (B, V)
        top = logits.topk(max(ks), dim=-1).indices  # (B, K)
        match = top == torch.from_numpy(targets[start : start + batch_size])[:, None]
        for k in ks:
            hits[k] += int(match[:, :k].any(dim=-1).sum())
    return {k: hits[k] / max(1, len(features)) for k in ks}


def unigram_accuracy(train_targets: np.ndarray, test_targets: np.ndarray, ks=(1, 5)) -> dict[int, float]:
    """The baseline that ignores the context: always the k most frequent training tokens."""
    ranked = np.argsort(-np.bincount(train_targets), kind="stable")
    return {k: float(np.isin(test_targets, ranked[:k]).mean()) for k in ks}


def head_state(head: BertLMPredictionHead) -> dict[str, torch.Tensor]:
    """Trained tensors under Hugging Face BertForMaskedLM names (the tied decoder is left out)."""
    return {
        f"cls.predictions.{name}": tensor.detach().clone().contiguous()
        for name, tensor in head.state_dict().items()
        if not name.startswith("decoder.")
    }
