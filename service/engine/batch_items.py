"""What the batcher (service/engine/batcher.py) works with: its limits, the queued inputs and jobs, their results
and the hooks for metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from bertserve.service.engine.tasks import TaskOptions


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int
    max_batch_tokens: int
    max_queue_delay_s: float
    max_queue_inputs: int
    max_padding_ratio: float = float("inf")  # padded tokens / real tokens a batch may reach
    max_queue_exclusive: int = 256  # exclusive jobs (attention runs) waiting
    max_bulk_batch_tokens: int = 4_194_304  # padded tokens of a bulk batch while interactive calls are active


@dataclass(eq=False, slots=True)
class WorkItem:
    """One input of one call, tokenized (slots: the engine makes one per input, its loop the bound)."""

    ids: np.ndarray  # (T,) int64
    type_ids: np.ndarray  # (T,) int64
    options: TaskOptions
    future: asyncio.Future  # or the engine's ResultSlot (service/engine/unary_calls.py)
    deadline: float | None = None  # time.monotonic() seconds
    mask_positions: np.ndarray | None = None  # fill_mask only
    model: Any = None  # the model whose head this row needs (ServedModel); None: the compute's only model
    bulk: bool = False  # a stream's input: batched after interactive inputs (see the module's docstring)
    origin: object = None  # the front process that sent it (the engine's batches mix fronts)
    enqueued_at: float = field(default_factory=time.monotonic)
    length: int = field(init=False)  # tokens: read many times per turn of the queue owner, so stored

    def __post_init__(self) -> None:
        self.length = int(self.ids.shape[0])


@dataclass(eq=False)
class ExclusiveJob:
    """One call that runs alone on the worker thread (an attention run)."""

    run: Callable[[], Any]
    tokens: int
    future: asyncio.Future
    deadline: float | None
    enqueued_at: float = field(default_factory=time.monotonic)


class ItemResult(NamedTuple):  # a tuple: made once per input on the engine's loop, at half a dataclass's cost
    value: Any  # what the compute function returned for this input
    queue_s: float  # from admission until the worker started the compute
    inference_s: float  # the compute, measured in the worker
    batch_id: int


@dataclass(frozen=True)
class BatchStats:
    size: int
    padded_tokens: int
    real_tokens: int
    queue_s: list[float]
    inference_s: float
    exclusive: bool = False  # an exclusive job (attention run), not an encoder batch
    origins: int = 1  # distinct `WorkItem.origin`s: the fronts whose inputs share the batch


class BatchObserver:
    """Hooks for metrics; the default does nothing."""

    def queue_depth(self, depth: int) -> None: ...
    def dropped(self, reason: str, count: int) -> None: ...
    def batch_done(self, stats: BatchStats) -> None: ...
    def batch_cost(self, fixed_s: float, token_s: float) -> None: ...


class Lane:
    """Queued batch inputs of one kind (interactive or bulk), in arrival order, owned by the queue owner."""

    def __init__(self, bulk: bool):
        self.bulk = bulk
        self.items: list[WorkItem] = []
        self.tokens = 0  # of the inputs queued in this lane, incoming included
        self.inputs = 0  # inputs queued in this lane, incoming included

    def __bool__(self) -> bool:
        return bool(self.items)
