"""The sequence-classification head (pooler + classifier) trained on a frozen encoder's [CLS] states.

Hugging Face semantics, which the server's classify task follows: logits = classifier(dropout(tanh(
pooler.dense(h_CLS)))). The pooler starts from the checkpoint's own pooler when it has one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertserve.export.model import BertConfig, BertPooler


@dataclass(frozen=True)
class ClassifierTraining:
    epochs: int = 40
    batch_size: int = 256
    learning_rate: float = 2e-3
    weight_decay: float = 0.01
    dropout: float = 0.1
    seed: int = 0


class ClassifierHead(nn.Module):
    def __init__(self, config: BertConfig, num_labels: int, dropout: float):
        super().__init__()
        self.pooler = BertPooler(config)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)

    def forward(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        pooled = self.pooler(cls_hidden[:, None, :])  # (B, C): the pooler reads position 0 of (B, T, C)
        return self.classifier(self.dropout(pooled))  # (B, L)


def train_classifier_head(
    config: BertConfig,
    features: np.ndarray,
    labels: np.ndarray,
    num_labels: int,
    initial_pooler: BertPooler | None = None,
    training: ClassifierTraining = ClassifierTraining(),
    log=print,
) -> ClassifierHead:
    torch.manual_seed(training.seed)
    head = ClassifierHead(config, num_labels, training.dropout)
    nn.init.normal_(head.classifier.weight, std=0.02)
    nn.init.zeros_(head.classifier.bias)
    if initial_pooler is not None:
        head.pooler.load_state_dict(initial_pooler.state_dict())
    x, y = torch.from_numpy(features), torch.from_numpy(labels)
    optimizer = torch.optim.AdamW(
        head.parameters(), lr=training.learning_rate, weight_decay=training.weight_decay
    )
    steps_per_epoch = (len(x) + training.batch_size - 1) // training.batch_size
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, training.learning_rate, total_steps=training.epochs * steps_per_epoch
    )
    generator = torch.Generator().manual_seed(training.seed)
    head.train()
    for epoch in range(training.epochs):
        order = torch.randperm(len(x), generator=generator)
        total = 0.0
        for start in range(0, len(order), training.batch_size):
            batch = order[start : start + training.batch_size]
            loss = F.cross_entropy(head(x[batch]), y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item() * len(batch)
        if (epoch + 1) % 5 == 0 or epoch + 1 == training.epochs:
            log(f"   classifier epoch {epoch + 1}/{training.epochs}: train loss {total / len(x):.3f}")
    head.eval()
    return head


@torch.inference_mode()
def predict(head: ClassifierHead, features: np.ndarray) -> np.ndarray:
    return head(torch.from_numpy(features)).argmax(dim=-1).numpy()


def head_state(head: ClassifierHead) -> dict[str, torch.Tensor]:
    """Trained tensors under Hugging Face BertForSequenceClassification names."""
    state = {f"bert.pooler.{k}": v for k, v in head.pooler.state_dict().items()}
    state |= {f"classifier.{k}": v for k, v in head.classifier.state_dict().items()}
    return {k: v.detach().clone().contiguous() for k, v in state.items()}
