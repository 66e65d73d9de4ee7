"""What a front asks of the inference core for one task (`InferenceCore.infer`); `None` = the model's
default. `embed`, `fill_mask` and `classify` take the same options as keyword arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from bertserve.service.engine.tasks import Task

ENCODINGS = ("float", "float16", "int8", "uint8", "binary", "ubinary")  # sentence-transformers' precisions
TRUNCATION_DIRECTIONS = ("right", "left")
CHUNK_POOLINGS = ("mean", "max")


@dataclass(frozen=True)
class EmbedCall:
    normalize: bool | None = None
    dimensions: int | None = None  # Matryoshka: one of the model's `dimensions` (None: all)
    dense: bool = True  # the pooled vector (with `tokens` or `sparse` it may be left out)
    tokens: bool = False  # token-level vectors
    sparse: bool = False  # SPLADE weights (a model with an MLM head)
    sparse_threshold: float = 0.0
    encodings: tuple[str, ...] = ("float",)  # of the dense vector: any of ENCODINGS
    task: ClassVar[Task] = Task.EMBED


@dataclass(frozen=True)
class Chunking:
    """Long inputs cut into overlapping windows, each embedded, pooled into one vector (dense only)."""

    length: int = 0  # tokens per window, special tokens included (0: the model's max_length)
    overlap: int = 0  # tokens shared by neighbouring windows
    pooling: str = "mean"  # one of CHUNK_POOLINGS; "mean" is weighted by each window's tokens


@dataclass(frozen=True)
class FillMaskCall:
    top_k: int | None = None  # None: 5
    sequences: bool = True  # also decode the input filled with each candidate
    task: ClassVar[Task] = Task.FILL_MASK


@dataclass(frozen=True)
class ClassifyCall:
    top_k: int | None = None  # None: every label
    raw_scores: bool = False
    task: ClassVar[Task] = Task.CLASSIFY


TaskCall = EmbedCall | FillMaskCall | ClassifyCall
