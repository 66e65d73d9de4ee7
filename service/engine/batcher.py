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
from bertserve.service.engine.queue_room import LaneRoom, Permit
from bertserve.service.engine.unary_calls import CallInputs, OnEnd, UnaryCall, submit_call
from bertserve.service.errors import DeadlineTooShort, InferenceFailed, Overloaded, ShuttingDown

log = logging.getLogger(__name__)

__all__ = [
    "abandon",
    "Batcher",
    "BatchLimits",
    "BatchObserver",
    "BatchStats",
    "ItemResult",
    "Permit",
    "WorkItem",
    "cut_batch",
]

# A call ended this close to its deadline is counted as expired rather than cancelled: a client's cancel at
# its deadline reaches the server early by as long as the server took to read the call's headers (under
# load, more than 50 ms), and the client saw DEADLINE_EXCEEDED. The native transport uses the same slack.
DEADLINE_SLACK_S = 0.25
EARLY_REFUSAL_SHARE = 0.5  # of the estimated queue wait that must fit before the deadline
INTERACTIVE_TURNS_PER_BULK = 4  # interactive batches in a row while bulk inputs wait, then one bulk batch
INTERACTIVE_RECENT_S = 1.0  # interactive calls count as active this long after the last one arrived or ended
# Batches handed to the workers beyond one per instance: the next batch waits in the executor and starts
# the moment an instance is free, without a round trip through the event loop (which is busy with calls).
PREFETCH_BATCHES = 1
DEAD_SCAN_S = 0.01  # the queue is read through this often for inputs whose caller left unannounced


def abandon(batcher: Any, futures: list[asyncio.Future]) -> None:
    """The caller is done with its inputs' `futures`: each still pending is cancelled, so the owner skips its
    input, and `batcher.note_dead()` is called if any was pending or cancelled (a cancelled task's awaited
    futures read done, cancelled)."""
    if any(future.cancelled() or not future.done() for future in futures):
        batcher.note_dead()
    for future in futures:
        future.cancel()


def _resolve(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _timed(fn: Callable[..., Any], *args) -> tuple[Any, float, float]:
    """Runs in the worker: (result, start in time.monotonic(), seconds of compute)."""
    started = time.monotonic()
    value = fn(*args)
    return value, started, time.monotonic() - started


def _run_live(compute: Callable[[list[WorkItem]], list[Any]], batch: list[WorkItem]):
    """Runs in the worker: computes the batch's inputs that are still wanted when it starts (a batch cut
    ahead waited for an instance; its callers may have left). ((indices computed, their values), start in
    time.monotonic(), seconds of compute). Reading `future.done()` here is safe: a future only ever goes
    from pending to done, so an input seen as wanted costs at most a wasted row."""
    started = time.monotonic()
    live = [
        i
        for i, item in enumerate(batch)
        if not item.future.done() and (item.deadline is None or item.deadline > started)
    ]
    values = compute([batch[i] for i in live]) if live else []
    return (live, values), started, time.monotonic() - started


class Batcher:
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
        self._compute = compute
        self.limits = limits
        self._executor = executor
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
        self._batches = 0
        # (rows, length) a batch is computed at, for counting its padded tokens (EncoderGroup's shape buckets)
        self.padded_shape: Callable[[int, int], tuple[int, int]] = lambda rows, length: (rows, length)
        self._last_was_exclusive = False
        self.cost = CostEstimate()
        self.cost_fit = BatchCostFit()
        # (counts, lengths) at which batches are cut by cost (`cut_by_cost`); None: by padding (`cut_batch`)
        self.cut_ladders: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self._owner: asyncio.Task | None = None

    @property
    def depth(self) -> int:
        """Inputs waiting: batch inputs and exclusive jobs."""
        return self._lanes[False].inputs + self._lanes[True].inputs + len(self._exclusive)

    def start(self) -> None:
        self._owner = asyncio.get_running_loop().create_task(self._run(), name=f"batcher-{self.name}")

    def estimated_wait_s(self, extra_tokens: int = 0, bulk: bool = False) -> float | None:
        """Seconds until `extra_tokens` more would be computed, at the recent cost per padded token (None
        before the first batch): bulk inputs wait for every queued token, interactive ones for the
        interactive tokens and one bulk batch."""
        per_token = self.cost.seconds_per_token
        if per_token is None:
            return None
        interactive, bulk_tokens = self._lanes[False].tokens, self._lanes[True].tokens
        ahead = interactive + bulk_tokens if bulk else interactive + min(bulk_tokens, self._bulk_budget())
        return (ahead + extra_tokens) * per_token / self.concurrency

    @property
    def _queued_tokens(self) -> int:
        return self._lanes[False].tokens + self._lanes[True].tokens

    def _check_room(self, n: int, bulk: bool) -> None:
        if self._closing:
            raise ShuttingDown(f"model {self.name}: the server is shutting down")
        # Each lane has its own bound, so streams filling theirs never refuse unary calls (memory: at most
        # twice max_queue_inputs inputs queued or being tokenized).
        room = self._room[bulk]
        if not room.fits(n):
            kind = "stream" if bulk else "unary"
            raise Overloaded(
                f"model {self.name}: the {kind} queue holds {room.used} of max_queue_inputs "
                f"{self.limits.max_queue_inputs} inputs (queued or being tokenized); this call adds {n}; "
                "retry later"
            )

    def reserve(self, n: int, bulk: bool = False, deadline: float | None = None) -> Permit:
        """Room for a call's `n` inputs, taken before its work (tokenization) or refused at once:
        Overloaded when the lane is full, DeadlineTooShort when the queue ahead cannot be computed in time."""
        self._check_room(n, bulk)
        self._check_deadline(0, deadline, bulk)
        return self._room[bulk].take(n)

    async def wait_room(self, n: int, bulk: bool = True) -> Permit:
        """Room for a stream request's `n` inputs, waited for in arrival order (Overloaded at once when
        `n` can never fit; ShuttingDown when the server stops)."""
        if self._closing:
            raise ShuttingDown(f"model {self.name}: the server is shutting down")
        if n > self.limits.max_queue_inputs:
            raise Overloaded(
                f"model {self.name}: {n} inputs is more than max_queue_inputs "
                f"{self.limits.max_queue_inputs}; send fewer inputs per request"
            )
        return await self._room[bulk].wait(n)

    def reserve_exclusive(self) -> Permit:
        """A place for one attention call, taken before its tokenization (Overloaded when full)."""
        if self._closing:
            raise ShuttingDown(f"model {self.name}: the server is shutting down")
        waiting = len(self._exclusive) + self._exclusive_held
        if waiting >= self.limits.max_queue_exclusive:
            raise Overloaded(
                f"model {self.name}: {waiting} attention calls are queued, "
                f"max_queue_attention {self.limits.max_queue_exclusive}; retry later"
            )
        self._exclusive_held += 1
        return Permit(_ExclusiveRoom(self), 1)

    def _check_admission(self, n: int, tokens: int, deadline: float | None, bulk: bool) -> None:
        self._check_room(n, bulk)
        self._check_deadline(tokens, deadline, bulk)

    def _check_deadline(self, tokens: int, deadline: float | None, bulk: bool) -> None:
        if deadline is None or self._queued_tokens == 0:  # nothing ahead: never refused for its deadline
            return
        wait = self.estimated_wait_s(tokens, bulk)
        # Refused only when even a fraction of the estimate would miss the deadline: the estimate is rough.
        if wait is not None and time.monotonic() + EARLY_REFUSAL_SHARE * wait > deadline:
            raise DeadlineTooShort(
                f"model {self.name}: the deadline is {max(0.0, deadline - time.monotonic()):.3f}s away, "
                f"the queue ahead needs about {wait:.3f}s"
            )

    def submit(self, items: list[WorkItem], permit: Permit | None = None) -> None:
        """Admits all of a call's inputs or none (all interactive or all bulk); results arrive on each
        item's future. With `permit` (from `reserve` or `wait_room`) their room is already taken: only the
        deadline is checked here; without one, room is taken now or the call refused."""
        if not items:
            return
        bulk = items[0].bulk
        if len(items) == 1:  # most calls under load: no generators
            tokens, deadline = items[0].length, items[0].deadline
        else:
            tokens = sum(item.length for item in items)
            deadline = min((i.deadline for i in items if i.deadline is not None), default=None)
        if permit is None:
            self._check_admission(len(items), tokens, deadline, bulk)
            self._room[bulk].used += len(items)  # queued now: freed when they leave the queue
        else:
            if self._closing:
                raise ShuttingDown(f"model {self.name}: the server is shutting down")
            self._check_deadline(tokens, deadline, bulk)
            self._room[bulk].used += len(items) - permit.inputs
            permit.hand_over()
        if not bulk:
            self._interactive_seen = time.monotonic()
        self._expires_at(deadline)
        self._incoming.extend(items)
        self._lanes[bulk].tokens += tokens
        self._lanes[bulk].inputs += len(items)
        self._depth_changed()
        if len(self._running) < self.concurrency + self._ahead(self._lanes[bulk]):
            self._wake()
        # else the owner can start nothing until a batch finishes, and that wakes it: a turn per call
        # under load would cost the event loop about 30 us and change nothing

    def submit_call(self, inputs: CallInputs, on_end: OnEnd, permit: Permit | None = None) -> UnaryCall:
        """A call's inputs queued at once, ended by one callback (service/engine/unary_calls.py)."""
        return submit_call(self, inputs, on_end, permit)

    async def submit_exclusive(
        self, run: Callable[[], Any], tokens: int, deadline: float | None, permit: Permit | None = None
    ) -> ItemResult:
        """Admits `run` (blocking, run on the worker thread alone) and awaits its result. Full: Overloaded
        (unless `permit`, from `reserve_exclusive`, holds its place); cancelled while queued: never run."""
        if permit is None:
            permit = self.reserve_exclusive()
        elif self._closing:
            raise ShuttingDown(f"model {self.name}: the server is shutting down")
        permit.release()  # its place becomes the queued job's
        job = ExclusiveJob(run, tokens, asyncio.get_running_loop().create_future(), deadline)
        self._exclusive.append(job)
        self._expires_at(deadline)
        self._depth_changed()
        self._wake()
        try:
            return await job.future
        finally:
            abandon(self, [job.future])  # the owner skips a job whose caller went away

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
            room.fail_waiting(ShuttingDown(f"model {self.name}: the server is shutting down"))

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

    def _classify_dead(self, waiting: list, now: float) -> tuple[list, list, list]:
        live, cancelled, expired = [], [], []
        for one in waiting:
            if one.future.done():  # the caller went away: it cancelled, or gRPC ended it at its deadline
                near_deadline = one.deadline is not None and one.deadline <= now + DEADLINE_SLACK_S
                (expired if near_deadline else cancelled).append(one)
            elif one.deadline is not None and one.deadline <= now:
                expired.append(one)
                one.future.set_exception(DeadlineTooShort("the deadline passed while the input was queued"))
            else:
                live.append(one)
        return live, cancelled, expired

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
            live, lane_cancelled, lane_expired = self._classify_dead(lane.items, now)
            if lane_cancelled or lane_expired:
                lane.items = live
                self._unqueue(lane, lane_cancelled + lane_expired)
                cancelled += lane_cancelled
                expired += lane_expired
        if self._exclusive:
            live_jobs, cancelled_jobs, expired_jobs = self._classify_dead(list(self._exclusive), now)
            if cancelled_jobs or expired_jobs:
                self._exclusive = deque(live_jobs)
                cancelled += cancelled_jobs
                expired += expired_jobs
                self._depth_changed()
        self._count_dropped(cancelled, expired)
        queued = (item for lane in self._lanes.values() for item in lane.items)
        deadlines = [one.deadline for one in (*queued, *self._exclusive) if one.deadline is not None]
        self._next_expiry = min(deadlines, default=float("inf"))

    def _count_dropped(self, cancelled: list, expired: list) -> None:
        for reason, dropped in (("cancelled", cancelled), ("deadline", expired)):
            if dropped:
                self._observer.dropped(reason, len(dropped))

    def _batch_full(self, lane: Lane, max_tokens: int) -> bool:
        if len(lane.items) >= self.limits.max_batch_size:
            return True
        longest = max(item.length for item in lane.items)
        return longest * (len(lane.items) + 1) > max_tokens

    async def _in_worker(
        self, waiting: list, run: Callable[..., Any], *args
    ) -> tuple[Any, float, float] | None:
        """`run(*args)` on the worker (`_timed` or `_run_live`: (value, start, seconds)); None when it
        failed (the futures are failed)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, run, *args)
        except asyncio.CancelledError:  # abort(): the grace period is over
            for one in waiting:
                if not one.future.done():
                    one.future.set_exception(ShuttingDown(f"model {self.name}: the server stopped"))
            raise
        except Exception as exc:
            log.exception("model %s: a run of %d inputs failed", self.name, len(waiting))
            error = exc if isinstance(exc, InferenceFailed) else None
            for one in waiting:
                if not one.future.done():
                    one.future.set_exception(
                        error or InferenceFailed(f"model {self.name}: inference failed: {exc}")
                    )
            return None

    async def _execute(self, lane: Lane, batch: list[WorkItem]) -> None:
        self._batches += 1
        batch_id = self._batches
        timed = await self._in_worker(batch, _run_live, self._compute, batch)
        if not lane.bulk:
            self._interactive_seen = time.monotonic()
        if timed is None:
            return
        (live, values), started, inference_s = timed
        if len(live) < len(batch):  # its callers left while it waited for an instance: count them
            computed = set(live)
            _, cancelled, expired = self._classify_dead(
                [item for i, item in enumerate(batch) if i not in computed], time.monotonic()
            )
            self._count_dropped(cancelled, expired)
            batch = [batch[i] for i in live]
            if not batch:
                return
        rows, length = self.padded_shape(len(batch), max(item.length for item in batch))
        padded = rows * length
        self.cost.add(inference_s, padded)
        if self.cut_ladders is not None:
            line = self.cost_fit.fit
            self.cost_fit.add(inference_s, padded)
            if self.cost_fit.fit is not line:
                self._observer.batch_cost(*self.cost_fit.fit)
        queue_s = [max(0.0, started - item.enqueued_at) for item in batch]
        for item, value, waited in zip(batch, values, queue_s, strict=True):
            if not item.future.done():
                item.future.set_result(ItemResult(value, waited, inference_s, batch_id))
        origins = len({item.origin for item in batch})
        real = sum(item.length for item in batch)
        self._observer.batch_done(BatchStats(len(batch), padded, real, queue_s, inference_s, origins=origins))

    async def _execute_exclusive(self, job: ExclusiveJob) -> None:
        self._depth_changed()
        _, cancelled, expired = self._classify_dead([job], time.monotonic())
        if cancelled or expired:  # its caller left since the queue was last read through
            self._count_dropped(cancelled, expired)
            return
        self._batches += 1
        batch_id = self._batches
        timed = await self._in_worker([job], _timed, job.run)
        if timed is None:
            return
        value, started, inference_s = timed
        waited = max(0.0, started - job.enqueued_at)
        if not job.future.done():
            job.future.set_result(ItemResult(value, waited, inference_s, batch_id))
        self._observer.batch_done(
            BatchStats(1, job.tokens, job.tokens, [waited], inference_s, exclusive=True)
        )


class _ExclusiveRoom:
    """What a permit from `reserve_exclusive` frees: a place among the attention calls admitted."""

    def __init__(self, batcher: Batcher):
        self.batcher = batcher

    def free(self, inputs: int) -> None:
        self.batcher._exclusive_held -= inputs
