"""The cross-encoder's trained part: the top `k` encoder layers (k = 0: none) + pooler + a one-logit
classifier, on hidden states of the frozen lower layers, computed once and cached.

Hugging Face BertForSequenceClassification semantics: logit = classifier(dropout(tanh(pooler.dense(h_CLS)))),
h the last layer's output. The pair is `[CLS] query [SEP] document [SEP]`, segment ids 0 then 1.
Loss per candidate list: softmax cross-entropy over the list (the relevant document first) plus binary
cross-entropy of each logit (so that sigmoid(logit), the served score, reads as a relevance probability).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from bertserve.export.model import BertModel, BertPooler
from bertserve.train.heads.features import length_batches

MAX_PAIR_TOKENS = 64  # WordNet pairs are short; the few longer ones are cut (longest_first)


@dataclass(frozen=True)
class RerankTraining:
    epochs: int = 2
    lists_per_batch: int = 8
    learning_rate: float = 1e-4  # the encoder layers
    head_learning_rate: float = 1e-3  # pooler + classifier
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    seed: int = 0


@dataclass
class HiddenStates:
    """Per pair: hidden states after some layers (T_i, C) float16, kept unpadded."""

    states: list[torch.Tensor]
    stacked: torch.Tensor | None = None  # float32 (N, 1, C) when every state is one position

    def batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, C) float32, zero-padded, and its attention mask (B, T)."""
        if self.stacked is not None:  # [CLS] states alone (N, 1, C): no padding to do
            index = torch.as_tensor(indices, dtype=torch.long)
            return self.stacked[index], torch.ones(len(index), 1, dtype=torch.long)
        rows = [self.states[i] for i in indices]
        longest = max(r.shape[0] for r in rows)
        hidden = torch.zeros(len(rows), longest, rows[0].shape[1])
        mask = torch.zeros(len(rows), longest, dtype=torch.long)
        for b, r in enumerate(rows):
            hidden[b, : r.shape[0]] = r.float()
            mask[b, : r.shape[0]] = 1
        return hidden, mask


def tokenize_pairs(tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]]) -> tuple[list, list]:
    """(ids, type_ids) per pair, with the tokenizer's own pair template, truncated longest_first."""
    tokenizer = Tokenizer.from_str(tokenizer.to_str())
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_PAIR_TOKENS, strategy="longest_first")
    encodings = tokenizer.encode_batch([list(p) for p in pairs])
    return [e.ids for e in encodings], [e.type_ids for e in encodings]


def _additive(mask: torch.Tensor) -> torch.Tensor:
    return (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min  # (B, 1, 1, T)


@torch.inference_mode()
def lower_states(
    encoder: BertModel, ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]], layers: int
) -> HiddenStates:
    """Embeddings + the first `layers` encoder layers of every pair, frozen, in length-sorted batches."""
    encoder.eval()
    out: list[torch.Tensor | None] = [None] * len(ids)
    for indices in length_batches([len(i) for i in ids]):
        longest = max(len(ids[i]) for i in indices)
        input_ids = torch.zeros(len(indices), longest, dtype=torch.long)
        types = torch.zeros(len(indices), longest, dtype=torch.long)
        mask = torch.zeros(len(indices), longest, dtype=torch.long)
        for b, i in enumerate(indices):
            input_ids[b, : len(ids[i])] = torch.tensor(ids[i])
            types[b, : len(ids[i])] = torch.tensor(type_ids[i])
            mask[b, : len(ids[i])] = 1
        x = encoder.embeddings(input_ids, types)
        for block in encoder.encoder.layer[:layers]:
            x, _ = block(x, _additive(mask))
        for b, i in enumerate(indices):
            out[i] = x[b, : len(ids[i])].to(torch.float16).clone()
    return HiddenStates(out)


@torch.inference_mode()
def advance(states: HiddenStates, blocks: Sequence[nn.Module], cls_only: bool = False) -> HiddenStates:
    """Runs frozen `blocks` on cached states; `cls_only` keeps position 0 alone (all a pooler reads)."""
    out: list[torch.Tensor | None] = [None] * len(states.states)
    for indices in length_batches([s.shape[0] for s in states.states]):
        x, mask = states.batch(indices)
        for block in blocks:
            x, _ = block.eval()(x, _additive(mask))
        for b, i in enumerate(indices):
            kept = x[b, :1] if cls_only else x[b, : int(mask[b].sum())]
            out[i] = kept.to(torch.float16).clone()
    return HiddenStates(out, torch.stack(out).float() if cls_only else None)


class TopModel(nn.Module):
    """Trained top layers (copies of the encoder's) + pooler + classifier -> one logit per pair."""

    def __init__(self, encoder: BertModel, trained_layers: int, dropout: float):
        super().__init__()
        total = len(encoder.encoder.layer)
        self.first_layer = total - trained_layers
        self.layers = nn.ModuleList(copy.deepcopy(encoder.encoder.layer[self.first_layer :]))
        self.pooler = BertPooler(encoder.config)
        if encoder.pooler is not None:
            self.pooler.load_state_dict(encoder.pooler.state_dict())
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(encoder.config.hidden_size, 1)
        nn.init.normal_(self.classifier.weight, std=0.02)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            hidden, _ = block(hidden, _additive(mask))
        return self.classifier(self.dropout(self.pooler(hidden)))[:, 0]  # (B,)

    def trained_state(self) -> dict[str, torch.Tensor]:
        """Trained tensors under Hugging Face BertForSequenceClassification names."""
        state = {
            f"bert.encoder.layer.{self.first_layer + i}.{k}": v
            for i, layer in enumerate(self.layers)
            for k, v in layer.state_dict().items()
        }
        state |= {f"bert.pooler.{k}": v for k, v in self.pooler.state_dict().items()}
        state |= {f"classifier.{k}": v for k, v in self.classifier.state_dict().items()}
        return {k: v.detach().clone().contiguous() for k, v in state.items()}

    def trained_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def train_top(
    model: TopModel,
    states: HiddenStates,
    list_size: int,
    training: RerankTraining,
    log: Callable[[str], None] = print,
    progress: Callable[[int], None] | None = None,
    every: int = 0,
) -> TopModel:
    """Trains on lists of `list_size` consecutive pairs whose first pair is the relevant one; calls
    `progress(batches)` every `every` batches over all epochs (0: never), in eval mode (it must not draw
    random numbers)."""
    lists = len(states.states) // list_size
    torch.manual_seed(training.seed)
    head = [*model.pooler.parameters(), *model.classifier.parameters()]
    head_ids = {id(p) for p in head}
    groups = [{"params": head, "lr": training.head_learning_rate}]
    if layers := [p for p in model.parameters() if id(p) not in head_ids]:
        groups.append({"params": layers, "lr": training.learning_rate})
    optimizer = torch.optim.AdamW(groups, weight_decay=training.weight_decay)
    steps = training.epochs * math.ceil(lists / training.lists_per_batch)
    warmup = max(1, int(training.warmup_fraction * steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup)))
    )
    generator = torch.Generator().manual_seed(training.seed)
    target = torch.zeros(list_size)
    target[0] = 1.0
    model.train()
    done = 0  # batches over all epochs
    for epoch in range(training.epochs):
        order = torch.randperm(lists, generator=generator)
        total = 0.0
        for start in range(0, lists, training.lists_per_batch):
            chosen = order[start : start + training.lists_per_batch]
            pairs = (chosen[:, None] * list_size + torch.arange(list_size)).flatten().tolist()
            logits = model(*states.batch(pairs)).view(len(chosen), list_size)
            loss = F.cross_entropy(logits, torch.zeros(len(chosen), dtype=torch.long))
            loss = loss + F.binary_cross_entropy_with_logits(logits, target.expand_as(logits))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item() * len(chosen)
            done += 1
            if every and done % every == 0:
                model.eval()
                progress(done)
                model.train()
            if (start // training.lists_per_batch + 1) % 50 == 0:
                log(
                    f"   epoch {epoch + 1}, list {start + len(chosen)}/{lists}: loss {total / (start + len(chosen)):.4f}"
                )
        log(f"   epoch {epoch + 1}/{training.epochs}: train loss {total / lists:.4f}")
    model.eval()
    return model


@torch.inference_mode()
def score(model: TopModel, states: HiddenStates) -> np.ndarray:
    model.eval()
    out = np.zeros(len(states.states), dtype=np.float32)
    for indices in length_batches([s.shape[0] for s in states.states]):
        out[indices] = model(*states.batch(indices)).numpy()
    return out


@torch.inference_mode()
def mean_pooled(encoder: BertModel, id_lists: Sequence[Sequence[int]]) -> np.ndarray:
    """The embedding model's sentence embeddings: mean over tokens of the last layer, L2-normalized."""
    from bertserve.train.heads.features import encode_batches

    out = np.zeros((len(id_lists), encoder.config.hidden_size), dtype=np.float32)
    for indices, hidden, mask in encode_batches(encoder, id_lists):
        summed = (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True)
        out[indices] = F.normalize(summed, dim=-1).numpy()
    return out
