"""BERT from scratch, in one file, with Hugging Face's parameter names.

Bottom-up: config -> embeddings -> self-attention -> feed-forward -> post-LN block -> encoder
-> pooler -> heads (masked-LM, sequence classification). Checkpoints made by `transformers`
load with `load_state_dict(strict=True)` once `export/checkpoint.py` has normalized their keys.

The attention is written out (no fused SDPA call) and the padding mask is the classic additive
`(1 - mask) * min_float`, so that the TorchScript-traced ONNX graph matches the patterns of ONNX
Runtime's transformer optimizer (EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu).

Shapes: B batch, T sequence, C hidden, H heads, D head size (C = H * D), V vocab, L labels.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),  # exact, erf-based: Hugging Face's "gelu"
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    classifier_dropout: float | None = None
    tie_word_embeddings: bool = True
    architectures: list[str] = field(default_factory=lambda: ["BertModel"])
    id2label: dict[int, str] = field(default_factory=lambda: {0: "LABEL_0", 1: "LABEL_1"})
    problem_type: str | None = None

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @classmethod
    def from_dict(cls, raw: dict) -> BertConfig:
        """Reads a Hugging Face config.json dict; raises ValueError for anything this BERT cannot run."""
        model_type = raw.get("model_type")
        if model_type != "bert":
            raise ValueError(
                f"model_type {model_type!r} is not supported; bertserve exports BERT (model_type 'bert')"
            )
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"position_embedding_type {raw['position_embedding_type']!r} is not supported")
        if raw.get("is_decoder", False):
            raise ValueError("is_decoder=true (a causal BERT) is not supported")
        if raw.get("hidden_act", "gelu") not in ACTIVATIONS:
            raise ValueError(
                f"hidden_act {raw['hidden_act']!r} is not supported (known: {sorted(ACTIVATIONS)})"
            )
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in known and v is not None}
        if "id2label" in kwargs:
            kwargs["id2label"] = {int(k): str(v) for k, v in kwargs["id2label"].items()}
        elif raw.get("num_labels"):
            kwargs["id2label"] = {i: f"LABEL_{i}" for i in range(int(raw["num_labels"]))}
        config = cls(**kwargs)
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(
                f"hidden_size {config.hidden_size} is not a multiple of num_attention_heads {config.num_attention_heads}"
            )
        return config

    @classmethod
    def from_json(cls, path: Path) -> BertConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # Sliced by the sequence length (not torch.arange(T)) so ORT recognizes the position path.
        positions = torch.arange(config.max_position_embeddings).unsqueeze(0)
        self.register_buffer("position_ids", positions, persistent=False)  # (1, max_positions)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.size(1)
        position_ids = self.position_ids[:, :T]  # (1, T)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)  # (B, T, C)
        x = x + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.n_head = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, C = x.size()
        q = self.query(x).view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, H, T, D)
        k = self.key(x).view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, H, T, D)
        v = self.value(x).view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, H, T, D)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)  # (B, H, T, T)
        scores = scores + additive_mask  # (B, 1, 1, T) broadcast over heads and queries
        probs = F.softmax(scores, dim=-1)  # (B, H, T, T)
        y = torch.matmul(self.dropout(probs), v)  # (B, H, T, D)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return y, probs


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(y)) + residual)  # post-LN


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, probs = self.self(x, additive_mask)
        return self.output(y, x), probs


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))  # (B, T, intermediate)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)  # post-LN


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, probs = self.attention(x, additive_mask)
        return self.output(self.intermediate(a), a), probs


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(config) for _ in range(config.num_hidden_layers)])


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))  # [CLS] -> (B, C)


class BertOutputs(NamedTuple):
    last_hidden_state: torch.Tensor  # (B, T, C)
    pooler_output: torch.Tensor | None  # (B, C)
    attentions: tuple[torch.Tensor, ...] | None  # per layer (B, H, T, T)


class BertModel(nn.Module):
    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> BertOutputs:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, C)
        mask = attention_mask[:, None, None, :].to(x.dtype)  # (B, 1, 1, T)
        additive_mask = (1.0 - mask) * torch.finfo(x.dtype).min  # 0 where attended, min_float on padding
        attentions = []
        for block in self.encoder.layer:
            x, probs = block(x, additive_mask)
            attentions.append(probs)
        pooled = self.pooler(x) if self.pooler is not None else None
        return BertOutputs(x, pooled, tuple(attentions) if output_attentions else None)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(h)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(
            config.hidden_size, config.vocab_size, bias=False
        )  # tied, see BertForMaskedLM
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(h)) + self.bias  # (..., C) -> (..., V)


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.predictions(h)


class BertForMaskedLM(nn.Module):
    def __init__(self, config: BertConfig, add_pooling_layer: bool = False):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=add_pooling_layer)
        self.cls = BertOnlyMLMHead(config)
        if config.tie_word_embeddings:
            self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        return self.cls(hidden)  # (B, T, V)


class BertForSequenceClassification(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=True)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        pooled = self.bert(input_ids, attention_mask, token_type_ids).pooler_output
        return self.classifier(self.dropout(pooled))  # (B, L)


def mean_pool(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over the attended tokens, as sentence-transformers' Pooling(mean) computes it: (B, T, C) -> (B, C)."""
    mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)  # (B, T, 1)
    summed = (last_hidden_state * mask).sum(dim=1)  # (B, C)
    return summed / mask.sum(dim=1).clamp(min=1e-9)
