"""Dynamic batching, one batcher per model, in the manner of text-embeddings-inference's queue.

One owner task holds the queue. Callers `submit` their tokenized inputs (one `WorkItem` each) and
await the items' futures; admission is decided at once (a full queue raises `Overloaded`). The owner
cuts batches by a token budget (padded length x inputs), a maximum batch size and a maximum queue
delay: it waits for more inputs only until the oldest queued input has waited `max_queue_delay`, or
until a batch is full. Inside that window inputs are grouped by length so padding stays small, and the
oldest input is always in the next batch (no starvation). A call's inputs may land in several batches;
each result goes to its own future, so the caller gets them back in order. Inputs whose caller
cancelled or whose deadline passed are dropped before compute and counted. The model runs in a worker
thread so the event loop keeps accepting; nothing here polls with sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bertserve.service.errors import DeadlineTooShort, InferenceFailed, Overloaded, ShuttingDown
from bertserve.service.tasks import TaskOptions

log = logging.getLogger(__name__)


# gRPC may end a call a few milliseconds before its deadline as the server computes it; a call ended
# this close to its deadline is counted as expired rather than cancelled.
DEADLINE_SLACK_S = 0.05
EARLY_REFUSAL_SHARE = 0.5  # of the estimated queue wait that must fit before the deadline


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int
    max_batch_tokens: int
    max_queue_delay_s: float
    max_queue_inputs: int
    max_padding_ratio: float = float("inf")  # padded tokens / real tokens a batch may reach


@dataclass(eq=False)
class WorkItem:
    """One input of one call, tokenized."""

    ids: np.ndarray  # (T,) int64
    type_ids: np.ndarray  # (T,) int64
    options: TaskOptions
    future: asyncio.Future
    deadline: float | None = None  # time.monotonic() seconds
    mask_positions: np.ndarray | None = None  # fill_mask only
    enqueued_at: float = field(default_factory=time.monotonic)

    @property
    def length(self) -> int:
        return int(self.ids.shape[0])


@dataclass(frozen=True)
class ItemResult:
    value: Any  # what the model's compute function returned for this input
    queue_s: float
    inference_s: float
    batch_id: int


@dataclass(frozen=True)
class BatchStats:
    size: int
    padded_tokens: int
    real_tokens: int
    queue_s: list[float]
    inference_s: float


class BatchObserver:
    """Hooks for metrics; the default does nothing."""

    def queue_depth(self, depth: int) -> None: ...
    def dropped(self, reason: str, count: int) -> None: ...
    def batch_done(self, stats: BatchStats) -> None: ...


def cut_batch(
    pending: Sequence[WorkItem], max_size: int, max_tokens: int, max_padding_ratio: float = float("inf")
) -> list[int]:
    """Indices into `pending` (arrival order) of the next batch.

    The oldest input (index 0) is always taken. Then, in length order, the batch grows towards its
    shorter or longer neighbour, whichever adds less padding, while padded length x count stays within
    `max_tokens`, padded tokens within `max_padding_ratio` x real tokens, and the count within
    `max_size`. A single input longer than the budget goes alone.
    """
    order = sorted(range(len(pending)), key=lambda i: (pending[i].length, i))
    lo = hi = order.index(0)
    longest = real = pending[0].length
    count = 1

    def fits(new_longest: int, new_real: int) -> bool:
        padded = new_longest * (count + 1)
        return padded <= max_tokens and padded <= max_padding_ratio * new_real

    while count < max_size:
        best: tuple[int, int, str] | None = None  # (added padding, arrival index, side)
        if lo > 0:
            shorter = pending[order[lo - 1]]
            if fits(longest, real + shorter.length):
                best = (longest - shorter.length, order[lo - 1], "lo")
        if hi + 1 < len(order):
            longer = pending[order[hi + 1]]
            if fits(longer.length, real + longer.length):
                candidate = ((longer.length - longest) * count, order[hi + 1], "hi")
                if best is None or candidate[:2] < best[:2]:
                    best = candidate
        if best is None:
            break
        if best[2] == "lo":
            lo -= 1
        else:
            hi += 1
            longest = pending[order[hi]].length
        real += pending[best[1]].length
        count += 1
    return sorted(order[lo : hi + 1])


class Batcher:
    def __init__(
        self,
        name: str,
        compute: Callable[[list[WorkItem]], list[Any]],
        limits: BatchLimits,
        executor: Executor,
        observer: BatchObserver | None = None,
    ):
        self.name = name
        self._compute = compute
        self.limits = limits
        self._executor = executor
        self._observer = observer or BatchObserver()
        self._incoming: deque[WorkItem] = deque()  # appended by submit, taken by the owner
        self._pending: list[WorkItem] = []  # owned by the owner task, arrival order
        self._depth = 0  # inputs queued (incoming + pending), not yet computing
        self._queued_tokens = 0
        self._wakeup = asyncio.Event()
        self._closing = False
        self._batches = 0
        self._seconds_per_token: float | None = None  # moving average of compute time per padded token
        self._owner: asyncio.Task | None = None

    @property
    def depth(self) -> int:
        return self._depth

    def start(self) -> None:
        self._owner = asyncio.get_running_loop().create_task(self._run(), name=f"batcher-{self.name}")

    def estimated_wait_s(self, extra_tokens: int = 0) -> float | None:
        if self._seconds_per_token is None:
            return None
        return (self._queued_tokens + extra_tokens) * self._seconds_per_token

    def submit(self, items: list[WorkItem]) -> None:
        """Admits all of a call's inputs or none; results arrive on each item's future."""
        if self._closing:
            raise ShuttingDown(f"model {self.name}: the server is shutting down")
        n = len(items)
        if self._depth + n > self.limits.max_queue_inputs:
            raise Overloaded(
                f"model {self.name}: queue holds {self._depth} of max_queue_inputs "
                f"{self.limits.max_queue_inputs} inputs; this call adds {n}; retry later"
            )
        tokens = sum(item.length for item in items)
        deadline = min((i.deadline for i in items if i.deadline is not None), default=None)
        wait = self.estimated_wait_s(tokens)
        # Refused only when even a fraction of the estimate would miss the deadline: the estimate is rough.
        if (
            deadline is not None
            and wait is not None
            and time.monotonic() + EARLY_REFUSAL_SHARE * wait > deadline
        ):
            raise DeadlineTooShort(
                f"model {self.name}: the deadline is {max(0.0, deadline - time.monotonic()):.3f}s away, "
                f"the queue ahead needs about {wait:.3f}s"
            )
        self._incoming.extend(items)
        self._depth += n
        self._queued_tokens += tokens
        self._observer.queue_depth(self._depth)
        self._wakeup.set()

    async def close(self) -> None:
        """Refuses new inputs, finishes the queued ones, then stops the owner."""
        self._closing = True
        self._wakeup.set()
        if self._owner is not None:
            await self._owner

    @property
    def running(self) -> bool:
        return self._owner is not None and not self._owner.done()

    async def abort(self) -> None:
        """Stops at once: queued inputs fail with ShuttingDown (used when the grace period is over)."""
        self._closing = True
        if self._owner is not None:
            self._owner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._owner
        self._take_incoming()
        for item in self._pending:
            if not item.future.done():
                item.future.set_exception(ShuttingDown(f"model {self.name}: the server stopped"))
        self._unqueue(self._pending)
        self._pending = []

    async def _run(self) -> None:
        while True:
            try:
                if await self._step():
                    return
            except Exception:  # a bug here must not leave callers waiting forever
                log.exception("model %s: batcher error; failing the queued inputs", self.name)
                self._take_incoming()
                for item in self._pending:
                    if not item.future.done():
                        item.future.set_exception(InferenceFailed(f"model {self.name}: batcher error"))
                self._unqueue(self._pending)
                self._pending = []

    async def _step(self) -> bool:
        """One turn of the owner: wait, or cut and run one batch. True when closed and empty."""
        self._take_incoming()
        self._drop_dead()
        if not self._pending:
            if self._closing:
                return True
            await self._wait_for_wakeup(None)
            return False
        if not self._closing and not self._batch_full():
            remaining = self._pending[0].enqueued_at + self.limits.max_queue_delay_s - time.monotonic()
            if remaining > 0:
                await self._wait_for_wakeup(remaining)
                return False
        limits = self.limits
        chosen = cut_batch(
            self._pending, limits.max_batch_size, limits.max_batch_tokens, limits.max_padding_ratio
        )
        taken = set(chosen)
        batch = [self._pending[i] for i in chosen]
        self._pending = [item for i, item in enumerate(self._pending) if i not in taken]
        await self._execute(batch)
        return False

    async def _wait_for_wakeup(self, timeout: float | None) -> None:
        self._wakeup.clear()
        if self._incoming or self._closing:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)

    def _take_incoming(self) -> None:
        while self._incoming:
            self._pending.append(self._incoming.popleft())

    def _unqueue(self, items: list[WorkItem]) -> None:
        self._depth -= len(items)
        self._queued_tokens -= sum(item.length for item in items)
        self._observer.queue_depth(self._depth)

    def _drop_dead(self) -> None:
        now = time.monotonic()
        live, cancelled, expired = [], [], []
        for item in self._pending:
            if item.future.done():  # the caller went away: it cancelled, or gRPC ended it at its deadline
                near_deadline = item.deadline is not None and item.deadline <= now + DEADLINE_SLACK_S
                (expired if near_deadline else cancelled).append(item)
            elif item.deadline is not None and item.deadline <= now:
                expired.append(item)
                item.future.set_exception(DeadlineTooShort("the deadline passed while the input was queued"))
            else:
                live.append(item)
        if cancelled or expired:
            self._pending = live
            self._unqueue(cancelled + expired)
            if cancelled:
                self._observer.dropped("cancelled", len(cancelled))
            if expired:
                self._observer.dropped("deadline", len(expired))

    def _batch_full(self) -> bool:
        if len(self._pending) >= self.limits.max_batch_size:
            return True
        longest = max(item.length for item in self._pending)
        return longest * (len(self._pending) + 1) > self.limits.max_batch_tokens

    async def _execute(self, batch: list[WorkItem]) -> None:
        self._unqueue(batch)
        self._batches += 1
        batch_id = self._batches
        started = time.monotonic()
        queue_s = [started - item.enqueued_at for item in batch]
        loop = asyncio.get_running_loop()
        try:
            values = await loop.run_in_executor(self._executor, self._compute, batch)
        except asyncio.CancelledError:  # abort(): the grace period is over
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(ShuttingDown(f"model {self.name}: the server stopped"))
            raise
        except Exception as exc:
            log.exception("model %s: batch %d of %d inputs failed", self.name, batch_id, len(batch))
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(InferenceFailed(f"model {self.name}: inference failed: {exc}"))
            return
        inference_s = time.monotonic() - started
        padded = max(item.length for item in batch) * len(batch)
        per_token = inference_s / padded
        self._seconds_per_token = (
            per_token if self._seconds_per_token is None else 0.8 * self._seconds_per_token + 0.2 * per_token
        )
        for item, value, waited in zip(batch, values, queue_s, strict=True):
            if not item.future.done():
                item.future.set_result(ItemResult(value, waited, inference_s, batch_id))
        self._observer.batch_done(
            BatchStats(len(batch), padded, sum(item.length for item in batch), queue_s, inference_s)
        )
