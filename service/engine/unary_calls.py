"""A call's inputs as a batcher queues them (`CallInputs`, `submit_call`): one result slot per input, and the
call ended once (all results in, the first error, or its caller's cancel) by a plain callback.

The slots stand in for asyncio futures where the batcher holds them (`WorkItem.future`): it asks `done()` (on
the event loop, and from the worker thread before a batch computes), `set_result` and `set_exception` (on the
loop). A future per input cost the loop a future, a done-callback and a turn of the loop per result, and the
caller a gathering future: a call of many inputs pays for one callback instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertserve.service.engine.batch_items import WorkItem
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.errors import ShuttingDown

_PENDING = object()
log = logging.getLogger("bertserve.batcher")
OnEnd = Callable[[list | None, BaseException | None], None]


@dataclass(slots=True)
class CallInputs:
    """One call's tokenized inputs for one encoder: each input once per option (task by task, in order), all
    for one served model; its results come back in that order, one `ItemResult` per row."""

    model: Any  # the ServedModel (a front's or the engine's own)
    ids: list[np.ndarray]  # (T,) int64 per input
    type_ids: list[np.ndarray]  # (T,) int64 per input
    options: list[TaskOptions]
    deadline: float | None = None  # time.monotonic() seconds
    bulk: bool = False  # a stream's inputs
    masks: list[np.ndarray] | None = None  # fill-mask's mask positions per input, for a fill-mask option

    @property
    def rows(self) -> int:
        return len(self.ids) * len(self.options)

    def work(self, slots: list, origin: object = None) -> list[WorkItem]:
        """The rows as queued work, each answered on its slot; `origin`: the front that sent them."""
        now = time.monotonic()
        if len(slots) == 1:  # most calls
            option = self.options[0]
            mask = self.masks[0] if self.masks is not None and option.task is Task.FILL_MASK else None
            fields = (option, slots[0], self.deadline, mask, self.model, self.bulk, origin, now)
            return [WorkItem(self.ids[0], self.type_ids[0], *fields)]
        work, slot = [], iter(slots)
        for option in self.options:
            masks = self.masks if option.task is Task.FILL_MASK else None
            for i, ids in enumerate(self.ids):
                mask = masks[i] if masks is not None else None
                fields = (option, next(slot), self.deadline, mask, self.model, self.bulk, origin, now)
                work.append(WorkItem(ids, self.type_ids[i], *fields))
        return work


def ended(on_end: OnEnd, results: list | None, error: BaseException | None) -> None:
    """`on_end(results, error)`, which must not raise: it runs inside the batcher's loops over a batch and
    the link's over a frame, where an exception would leave the others unanswered. One that does is logged."""
    try:
        on_end(results, error)
    except Exception:
        log.exception("a call's end failed")


def settle(future: asyncio.Future) -> OnEnd:
    """An `on_end` that resolves `future` with the results or the error (a cancelled call: ShuttingDown);
    nothing once `future` is done (its caller went away)."""

    def end(results: list | None, error: BaseException | None) -> None:
        if future.done():
            return
        if results is not None:
            future.set_result(results)
        else:
            future.set_exception(error or ShuttingDown("the call was cancelled"))

    return end


def submit_call(batcher: Any, inputs: CallInputs, on_end: OnEnd, permit=None, origin=None) -> UnaryCall:
    """Queues `inputs` in `batcher` (a Batcher: room from `permit`, else taken now; a refusal raises). `on_end`
    runs once on the loop, and must not raise: (every row's ItemResult, None), (None, the first error), or
    (None, None) after the returned call's `cancel()`, which drops its inputs still queued."""
    call = UnaryCall(inputs.rows, on_end, batcher.note_dead)
    if not inputs.rows:  # nothing to queue (no caller sends such a call): answered at once
        call._end([], None)
        return call
    batcher.submit(inputs.work(call.slots(), origin), permit)
    return call


class UnaryCall:
    """`on_end(results, error)` runs once: (every input's result in order, None), (None, the first error),
    or (None, None) when cancelled. Results that come after the end are dropped. `note_dead()` (the
    batcher's) runs first when the call ends with inputs that may still be queued."""

    __slots__ = ("results", "waiting", "ended", "_on_end", "_note_dead")

    def __init__(self, inputs: int, on_end: OnEnd, note_dead: Callable[[], None] = lambda: None):
        self.results: list = [_PENDING] * inputs
        self.waiting = inputs
        self.ended = False
        self._on_end = on_end
        self._note_dead = note_dead

    def slots(self) -> list[ResultSlot]:
        """One per input, in order (not kept here: the call and its slots form no cycle for the collector)."""
        return [ResultSlot(self, i) for i in range(len(self.results))]

    def cancel(self) -> None:
        """The caller's cancel (nothing once ended): the queued inputs are skipped (their slots read done)."""
        self._end(None, None)

    def _end(self, results: list | None, error: BaseException | None) -> None:
        if not self.ended:
            self.ended = True
            if results is None and (error is None or len(self.results) > 1):
                self._note_dead()  # its (other) inputs may still be queued
            ended(self._on_end, results, error)

    def _set(self, index: int, value: object) -> None:
        if self.ended or self.results[index] is not _PENDING:
            return
        self.results[index] = value
        self.waiting -= 1
        if not self.waiting:
            self._end(self.results, None)


class ResultSlot:
    """One input's place in its `UnaryCall`, with the part of asyncio.Future's interface the batcher uses."""

    __slots__ = ("call", "index")

    def __init__(self, call: UnaryCall, index: int):
        self.call, self.index = call, index

    def done(self) -> bool:
        """Its result is in, or the call has ended (answered, failed or cancelled)."""
        return self.call.ended or self.call.results[self.index] is not _PENDING

    def set_result(self, value: object) -> None:
        self.call._set(self.index, value)

    def set_exception(self, error: BaseException) -> None:
        """Ends the whole call with `error` (the front answers it with that error)."""
        self.call._end(None, error)
