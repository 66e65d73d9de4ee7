"""Dynamic batching, one queue owner per encoder, in the manner of text-embeddings-inference's queue.

One owner task holds the queue of an encoder graph (shared by every model and task that runs on it).
Callers `submit` their tokenized inputs (one `WorkItem` each, naming its model and task; `submit_call` makes
them for a whole call, answered by one callback) and await the items' futures; admission is decided at once
(a full queue raises `Overloaded`, a deadline the queue ahead cannot meet raises `DeadlineTooShort`). The
owner cuts batches by a token budget (padded length x inputs), a maximum batch size and a maximum queue
delay: it waits for more inputs only until the oldest queued input has waited `max_queue_delay`, or until a
batch is full. Inside that window inputs are grouped by length so padding stays small (`cut_batch`), or,
with `cut_ladders` and a batch's cost measured, into the batch nearest an ideal one, full and unpadded
(`cut_by_cost`); the oldest input is always in it. A call's inputs may land in several batches; each result
goes to its own future (or slot), so the caller gets them back in order. Inputs whose caller cancelled or
whose deadline passed are dropped before compute and counted.

Two lanes of batch work: interactive (unary calls) and bulk (streams: `WorkItem.bulk`). Interactive
inputs go first; bulk batches run when no interactive input waits, or after `INTERACTIVE_TURNS_PER_BULK`
interactive batches in a row (bulk work is never starved). While interactive calls are active (one seen
within `INTERACTIVE_RECENT_S`), bulk batches are cut to `max_bulk_batch_tokens`, so an interactive call
that arrives waits behind at most one small bulk batch; otherwise they use the same limits as any batch.

With `concurrency` N (the encoder's model instances), up to N batches compute at once, each on its own
worker thread; the queued inputs are shared out between free instances, and while interactive calls are
active bulk batches leave one instance free for them. One batch more than N (`PREFETCH_BATCHES`) is cut
ahead and waits in the executor, so an instance never idles while the loop answers calls; a bulk batch is
never cut ahead while interactive calls are active (it would stand between them and the instance). With
`prefetch` 0 and `ahead_when_full` (the engine process: its batches grow while the device computes), a batch
is still cut ahead once the queue holds a full one (`max_batch_size` inputs or `max_batch_tokens` tokens): it
could not grow, and the instance then starts it without waiting for the loop.

Exclusive jobs (Attention runs: one input through another graph) are admitted by the same owner
(`submit_exclusive`, their own limit `max_queue_exclusive`) and run on the same worker thread; the owner
alternates, so a batch waits behind at most one exclusive job and never shares the cores with one.

Compute runs in a worker thread so the event loop keeps accepting. Queue time is measured up to the
moment the worker starts the compute, inference time inside the worker. Nothing here polls with sleeps.

Three files: admission and `submit` (service/engine/queue_admission.py), the owner's turns (here), a
batch's run and its answers (service/engine/batch_runs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from bertserve.service.engine.batch_items import (
    BatchLimits,
    BatchObserver,
    BatchStats,
    ExclusiveJob,
    ItemResult,
    Lane,
    WorkItem,
)
from bertserve.service.engine.batch_policy import BatchCostFit, CostEstimate, cut_batch, cut_by_cost
from bertserve.service.engine.batch_runs import DEADLINE_SLACK_S, BatchRuns, classify_dead, count_dropped
from bertserve.service.engine.queue_admission import Admission
from bertserve.service.engine.queue_room import LaneRoom, Permit
from bertserve.service.errors import InferenceFailed, ShuttingDown

log = logging.getLogger(__name__)

__all__ = [
    "DEADLINE_SLACK_S",
    "Batcher",
    "BatchLimits",
    "BatchObserver",
    "BatchStats",
    "ItemResult",
    "Permit",
    "WorkItem",
    "cut_batch",
]

INTERACTIVE_TURNS_PER_BULK = 4  # interactive batches in a row while bulk inputs wait, then one bulk batch
INTERACTIVE_RECENT_S = 1.0  # interactive calls count as active this long after the last one arrived or ended
# Batches handed to the workers beyond one per instance: the next batch waits in the executor and starts
# the moment an instance is free, without a round trip through the event loop (which is busy with calls).
PREFETCH_BATCHES = 1
DEAD_SCAN_S = 0.01  # the queue is read through this often for inputs whose caller left unannounced


def _resolve(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Batcher(Admission):
    def __init__(
        self,
        name: str,
        compute: Callable[[list[WorkItem]], list[Any]],
        limits: BatchLimits,
        executor: Executor,
        observer: BatchObserver | None = None,
        concurrency: int = 1,
        prefetch: int | None = None,
        ahead_when_full: bool = False,
    ):
        """`concurrency`: batches computed at once (the encoder's instances; `executor` has that many
        threads); `prefetch`: batches cut ahead beyond those (None: PREFETCH_BATCHES); `ahead_when_full`:
        with `prefetch` 0, one batch all the same when the queue holds a full one."""
        self.name = name
        self.concurrency = concurrency
        self._prefetch = PREFETCH_BATCHES if prefetch is None else prefetch
        self._ahead_when_full = ahead_when_full
        self._running: dict[asyncio.Task, bool] = {}  # batches computing -> bulk or not
        self.limits = limits
        self._observer = observer or BatchObserver()
        self._incoming: deque[WorkItem] = deque()  # appended by submit, taken by the owner
        self._lanes = {False: Lane(bulk=False), True: Lane(bulk=True)}  # owned by the owner task
        # per lane: queued inputs plus those admitted and still being tokenized (service/engine/queue_room.py)
        self._room = {bulk: LaneRoom(limits.max_queue_inputs) for bulk in (False, True)}
        self._exclusive_held = 0  # attention calls admitted, not yet queued (being tokenized)
        self._interactive_streak = 0  # interactive batches run in a row while bulk inputs waited
        self._interactive_seen = -float("inf")  # time.monotonic() an interactive call last arrived or ended
        self._exclusive: deque[ExclusiveJob] = deque()
        self._next_expiry = float("inf")  # no queued input's deadline is earlier (`_drop_dead`)
        self._dead_scan_at = 0.0  # time.monotonic() of the next read through the queue for dead inputs
        self._depth_pending = False  # a write of the queue-depth gauge is scheduled
        self._waiter: asyncio.Future | None = None  # what the owner awaits while it waits (`_wake`)
        self._closing = False
        # (rows, length) a batch is computed at, for counting its padded tokens (EncoderGroup's shape buckets)
        self.padded_shape: Callable[[int, int], tuple[int, int]] = lambda rows, length: (rows, length)
        self._last_was_exclusive = False
        # (counts, lengths) at which batches are cut by cost (`cut_by_cost`); None: by padding (`cut_batch`)
        self.cut_ladders: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self._owner: asyncio.Task | None = None
        self.runs = BatchRuns(name, compute, executor, self._observer)

    @property
    def cost(self) -> CostEstimate:
        return self.runs.cost

    @property
    def cost_fit(self) -> BatchCostFit:
        return self.runs.cost_fit

    @property
    def depth(self) -> int:
        """Inputs waiting: batch inputs and exclusive jobs."""
        return self._lanes[False].inputs + self._lanes[True].inputs + len(self._exclusive)

    def start(self) -> None:
        self._owner = asyncio.get_running_loop().create_task(self._run(), name=f"batcher-{self.name}")

    async def close(self) -> None:
        """Refuses new inputs, finishes the queued ones, then stops the owner."""
        self._closing = True
        self._fail_waiting_room()
        self._wake()
        if self._owner is not None:
            await self._owner

    @property
    def running(self) -> bool:
        return self._owner is not None and not self._owner.done()

    async def abort(self) -> None:
        """Stops at once: queued inputs fail with ShuttingDown (used when the grace period is over)."""
        self._closing = True
        self._fail_waiting_room()
        for task in (self._owner, *self._running):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._fail_queued(ShuttingDown(f"model {self.name}: the server stopped"))

    def _fail_waiting_room(self) -> None:
        for room in self._room.values():
            room.fail_waiting(self._shutting_down())

    def _fail_queued(self, error: Exception) -> None:
        self._take_incoming()
        lanes = self._lanes.values()
        for waiting in (*(item for lane in lanes for item in lane.items), *self._exclusive):
            if not waiting.future.done():
                waiting.future.set_exception(error)
        for lane in lanes:
            self._unqueue(lane, lane.items)
            lane.items = []
        self._exclusive.clear()
        self._depth_changed()

    async def _run(self) -> None:
        while True:
            try:
                if await self._step():
                    return
            except Exception:  # a bug here must not leave callers waiting forever
                log.exception("model %s: batcher error; failing the queued inputs", self.name)
                self._fail_queued(InferenceFailed(f"model {self.name}: batcher error"))

    async def _step(self) -> bool:
        """One turn of the owner: wait, or run one exclusive job or one batch. True when closed and empty.

        Turns alternate when both kinds wait: after an exclusive job, a queued batch goes first."""
        self._take_incoming()
        self._drop_dead()
        lane = self._next_lane()
        batch_work = any(self._lanes.values())
        if self._exclusive and not (self._last_was_exclusive and batch_work):
            if self._running:  # an exclusive job runs alone: after the batches computing
                await self._wait_for_wakeup(None)
                return False
            self._last_was_exclusive = True
            await self._execute_exclusive(self._exclusive.popleft())
            return False
        if lane is None:
            if self._closing and not batch_work and not self._running:
                return True
            await self._wait_for_wakeup(None)  # an input arrives, or a batch finishes
            return False
        max_tokens = self._bulk_budget() if lane.bulk else self.limits.max_batch_tokens
        if not self._closing and not self._exclusive and not self._batch_full(lane, max_tokens):
            remaining = lane.items[0].enqueued_at + self.limits.max_queue_delay_s - time.monotonic()
            if remaining > 0:
                await self._wait_for_wakeup(remaining)
                return False
        limits = self.limits
        # with several instances free, the queued inputs are shared out instead of all going to one
        share = -(-len(lane.items) // max(1, self.concurrency - len(self._running)))
        chosen = self._cut(lane.items, min(limits.max_batch_size, share), max_tokens)
        taken = set(chosen)
        batch = [lane.items[i] for i in chosen]
        lane.items = [item for i, item in enumerate(lane.items) if i not in taken]
        self._last_was_exclusive = False
        waiting_bulk = bool(self._lanes[True])
        self._interactive_streak = self._interactive_streak + 1 if not lane.bulk and waiting_bulk else 0
        self._unqueue(lane, batch)
        task = asyncio.get_running_loop().create_task(self._execute(lane, batch))
        self._running[task] = lane.bulk
        task.add_done_callback(self._batch_finished)
        return False

    def seed_cost(self, points: list[tuple[int, float]]) -> None:
        """A first batch-cost line through (padded tokens, seconds) of runs that were not batches."""
        self.cost_fit.seed(points)
        if self.cost_fit.fit is not None:
            self._observer.batch_cost(*self.cost_fit.fit)

    def _cut(self, items: list[WorkItem], max_size: int, max_tokens: int) -> list[int]:
        """By cost once the cost of a batch is known and `cut_ladders` are set, else by padding."""
        ratio, fit = self.limits.max_padding_ratio, self.cost_fit.fit
        if self.cut_ladders is None or fit is None:
            return cut_batch(items, max_size, max_tokens, ratio)
        return cut_by_cost(items, max_size, max_tokens, ratio, self.cut_ladders, self.padded_shape, fit)

    def _batch_finished(self, task: asyncio.Task) -> None:
        self._running.pop(task, None)
        self._wake()
        if not task.cancelled() and (error := task.exception()) is not None:  # a bug: futures unanswered
            log.error("model %s: a batch failed outside the compute", self.name, exc_info=error)

    def _next_lane(self) -> Lane | None:
        """The lane whose batch starts now, None when none may: interactive first, bulk when no interactive
        input waits or after a streak of interactive batches."""
        interactive, bulk = self._lanes[False], self._lanes[True]
        bulk_turn = bulk and self._interactive_streak >= INTERACTIVE_TURNS_PER_BULK
        for lane in (bulk, interactive) if bulk_turn else (interactive, bulk):
            if lane and self._may_start(lane):
                return lane
        return None

    def _may_start(self, lane: Lane) -> bool:
        """A free instance (or room to cut one batch ahead), and for a bulk batch beside interactive calls,
        one instance left free for them (with several instances: a unary call then never waits for a
        stream's batch) and no bulk batch cut ahead."""
        running = len(self._running)
        if running >= self.concurrency + self._ahead(lane):
            return False
        if running >= self.concurrency and lane.bulk and self._interactive_active():
            return False
        if not lane.bulk or self.concurrency == 1 or not self._interactive_active():
            return True
        return sum(self._running.values()) < self.concurrency - 1

    def _ahead(self, lane: Lane) -> int:
        """Batches that may wait for an instance: `prefetch`, or one when the lane holds a full batch."""
        if self._prefetch or not self._ahead_when_full:
            return self._prefetch
        if lane.bulk and self._interactive_active():  # never cut ahead (`_may_start`): no wake for it
            return 0
        limits = self.limits
        return int(lane.inputs >= limits.max_batch_size or lane.tokens >= limits.max_batch_tokens)

    def _interactive_active(self) -> bool:
        return time.monotonic() - self._interactive_seen < INTERACTIVE_RECENT_S

    def _bulk_budget(self) -> int:
        """Padded tokens of the next bulk batch: small while interactive calls are active."""
        limit = self.limits.max_batch_tokens
        return min(limit, self.limits.max_bulk_batch_tokens) if self._interactive_active() else limit

    async def _wait_for_wakeup(self, timeout: float | None) -> None:
        """Until `_wake` (an input, a finished batch, a close) or `timeout` seconds. One future and at most
        one timer: a wake-up resumes the owner in the event loop's next turn (an Event awaited through
        `wait_for` took two, three with a timeout, each behind the fronts' frames of a busy loop)."""
        if self._incoming or (self._closing and not self._running):
            return
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _resolve, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _wake(self) -> None:
        """Resumes the owner if it waits (one that is not waiting reads the queue again before it does)."""
        if self._waiter is not None:
            _resolve(self._waiter)

    def _depth_changed(self) -> None:
        """The queue-depth gauge is written once per turn of the event loop, after what changed it."""
        if not self._depth_pending:
            self._depth_pending = True
            asyncio.get_running_loop().call_soon(self._report_depth)

    def _report_depth(self) -> None:
        self._depth_pending = False
        self._observer.queue_depth(self.depth)

    def _take_incoming(self) -> None:
        while self._incoming:
            item = self._incoming.popleft()
            self._lanes[item.bulk].items.append(item)

    def _unqueue(self, lane: Lane, items: list[WorkItem]) -> None:
        lane.inputs -= len(items)
        lane.tokens -= sum(item.length for item in items)
        self._depth_changed()
        self._room[lane.bulk].free(len(items))  # streams waiting for room may take it now

    def _expires_at(self, deadline: float | None) -> None:
        """A queued input's or job's deadline: `_drop_dead` reads the queue through by then."""
        if deadline is not None and deadline < self._next_expiry:
            self._next_expiry = deadline

    def note_dead(self) -> None:
        """A caller left with inputs still queued: the next turn looks for them."""
        self._dead_scan_at = 0.0

    def _drop_dead(self) -> None:
        """Drops the queued inputs and jobs whose caller left or whose deadline passed. The queue is read
        through at a deadline's time, after `note_dead`, and otherwise at most every DEAD_SCAN_S (a caller
        may leave unannounced); an input cut into a batch in between is skipped there and counted there."""
        now = time.monotonic()
        if now < self._dead_scan_at and now < self._next_expiry:
            return
        self._dead_scan_at = now + DEAD_SCAN_S
        cancelled, expired = [], []
        for lane in self._lanes.values():
            live, lane_cancelled, lane_expired = classify_dead(lane.items, now)
            if lane_cancelled or lane_expired:
                lane.items = live
                self._unqueue(lane, lane_cancelled + lane_expired)
                cancelled += lane_cancelled
                expired += lane_expired
        if self._exclusive:
            live_jobs, cancelled_jobs, expired_jobs = classify_dead(list(self._exclusive), now)
            if cancelled_jobs or expired_jobs:
                self._exclusive = deque(live_jobs)
                cancelled += cancelled_jobs
                expired += expired_jobs
                self._depth_changed()
        count_dropped(self._observer, cancelled, expired)
        queued = (item for lane in self._lanes.values() for item in lane.items)
        deadlines = [one.deadline for one in (*queued, *self._exclusive) if one.deadline is not None]
        self._next_expiry = min(deadlines, default=float("inf"))

    def _batch_full(self, lane: Lane, max_tokens: int) -> bool:
        if len(lane.items) >= self.limits.max_batch_size:
            return True
        longest = max(item.length for item in lane.items)
        return longest * (len(lane.items) + 1) > max_tokens

    async def _execute(self, lane: Lane, batch: list[WorkItem]) -> None:
        await self.runs.batch(batch, self.padded_shape, self.cut_ladders is not None)
        if not lane.bulk:
            self._interactive_seen = time.monotonic()

    async def _execute_exclusive(self, job: ExclusiveJob) -> None:
        self._depth_changed()
        await self.runs.exclusive(job)
