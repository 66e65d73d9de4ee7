"""What comes into a batcher's queue (service/engine/batcher.py): room taken or refused, then inputs queued.

A call's room is taken before its work (tokenization) or refused at once: a full lane raises `Overloaded`,
a deadline the queue ahead cannot meet `DeadlineTooShort` (refused only when even a share of the estimated
wait misses it: the estimate is rough), a closing batcher `ShuttingDown`. Stream requests wait for room in
arrival order instead. `submit` queues a call's inputs all or none and wakes the queue owner when it can
start a batch. `Admission` is the batcher's incoming half: it reads and writes the queue state `Batcher`
keeps (its lanes, incoming inputs, exclusive jobs, the cost of recent batches).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from bertserve.service.engine.batch_items import ExclusiveJob, ItemResult, WorkItem
from bertserve.service.engine.queue_room import Permit
from bertserve.service.engine.unary_calls import CallInputs, OnEnd, UnaryCall, submit_call
from bertserve.service.errors import DeadlineTooShort, Overloaded, ShuttingDown

EARLY_REFUSAL_SHARE = 0.5  # of the estimated queue wait that must fit before the deadline


def abandon(batcher: Any, futures: list[asyncio.Future]) -> None:
    """The caller is done with its inputs' `futures`: each still pending is cancelled, so the owner skips its
    input, and `batcher.note_dead()` is called if any was pending or cancelled (a cancelled task's awaited
    futures read done, cancelled)."""
    if any(future.cancelled() or not future.done() for future in futures):
        batcher.note_dead()
    for future in futures:
        future.cancel()


class Admission:
    """The batcher's incoming half (a base of `Batcher`, which holds the state named here)."""

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

    def _shutting_down(self) -> ShuttingDown:
        return ShuttingDown(f"model {self.name}: the server is shutting down")

    def _check_open(self) -> None:
        if self._closing:
            raise self._shutting_down()

    def _check_room(self, n: int, bulk: bool) -> None:
        self._check_open()
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
        self._check_open()
        if n > self.limits.max_queue_inputs:
            raise Overloaded(
                f"model {self.name}: {n} inputs is more than max_queue_inputs "
                f"{self.limits.max_queue_inputs}; send fewer inputs per request"
            )
        return await self._room[bulk].wait(n)

    def reserve_exclusive(self) -> Permit:
        """A place for one attention call, taken before its tokenization (Overloaded when full)."""
        self._check_open()
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
            self._check_open()
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
        else:
            self._check_open()
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


class _ExclusiveRoom:
    """What a permit from `reserve_exclusive` frees: a place among the attention calls admitted."""

    def __init__(self, batcher: Admission):
        self.batcher = batcher

    def free(self, inputs: int) -> None:
        self.batcher._exclusive_held -= inputs
