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
    top_k: int = 5  # fill_mask; classify (0 = all labels)
    raw_scores: bool = False  # classify
