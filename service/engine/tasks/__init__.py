"""Per-task request options and numpy post-processing of graph outputs (no I/O, no gRPC)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Task(str, Enum):
    EMBED = "embed"
    FILL_MASK = "fill_mask"
    CLASSIFY = "classify"


@dataclass(frozen=True)
class TaskOptions:
    """What one call asked for; shared by all of the call's inputs."""

    task: Task
    normalize: bool = False  # embed
    dimensions: int = 0  # embed: Matryoshka, the first `dimensions` values before normalizing (0 = all)
    dense: bool = True  # embed: the pooled vector
    tokens: bool = False  # embed: token-level vectors (last_hidden_state rows of the input's tokens)
    sparse: bool = False  # embed: SPLADE over the model's MLM head
    sparse_threshold: float = 0.0  # embed: sparse weights at or below this are left out
    top_k: int = 5  # fill_mask; classify (0 = all labels)
    raw_scores: bool = False  # classify
