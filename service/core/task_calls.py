"""What a front asks of the inference core for one task (`InferenceCore.infer`); `None` = the model's
default. `embed`, `fill_mask` and `classify` take the same options as keyword arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from bertserve.service.engine.tasks import Task


@dataclass(frozen=True)
class EmbedCall:
    normalize: bool | None = None
    task: ClassVar[Task] = Task.EMBED


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
