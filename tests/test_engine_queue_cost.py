"""What the engine's loop spends per queued input: a unary call's result slots, the queue read through for dead
inputs only when one may be there, the queue-depth gauge written once per turn."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bertserve.service.engine import batcher as batcher_module
from bertserve.service.engine.batcher import Batcher, BatchLimits, BatchObserver, WorkItem
from bertserve.service.engine.messages import inputs_out
from bertserve.service.engine.process import Engine
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.engine.unary_calls import UnaryCall

EMBED = TaskOptions(Task.EMBED)


def item(length: int, tag: int, future, deadline: float | None = None) -> WorkItem:
    ids = np.full(length, tag, dtype=np.int64)
    return WorkItem(ids, np.zeros(length, dtype=np.int64), EMBED, future=future, deadline=deadline)


def limits(**kw) -> BatchLimits:
    base = dict(max_batch_size=4, max_batch_tokens=10_000, max_queue_delay_s=0.001, max_queue_inputs=1000)
    return BatchLimits(**(base | kw))


class Tally(BatchObserver):
    def __init__(self):
        self.depths: list[int] = []
        self.dropped_counts: dict[str, int] = {}

    def queue_depth(self, depth):
        self.depths.append(depth)

    def dropped(self, reason, count):
        self.dropped_counts[reason] = self.dropped_counts.get(reason, 0) + count


@contextlib.asynccontextmanager
async def held_batcher(**kw):
    """(batcher, tally, gate, first): a batcher cutting no batch ahead whose compute waits for `gate` (5 s
    at most), with one input (`first`) computing, so what comes next stays queued until the gate opens."""
    tally, gate = Tally(), threading.Event()
    with ThreadPoolExecutor(1) as pool:
        compute = lambda b: (gate.wait(5), [0] * len(b))[1]  # noqa: E731
        batcher = Batcher("m", compute, limits(**kw), pool, tally, prefetch=0)
        batcher.start()
        first = item(4, 0, asyncio.get_running_loop().create_future())
        batcher.submit([first])
        while not batcher._running:
            await asyncio.sleep(0.001)
        try:
            yield batcher, tally, gate, first
        finally:
            gate.set()
            await batcher.close()


def test_a_unary_call_ends_once_with_its_results_in_order():
    ends = []
    call = UnaryCall(3, lambda results, error: ends.append((results, error)))
    slots = call.slots()
    slots[2].set_result("c")
    slots[0].set_result("a")
    assert [s.done() for s in slots] == [True, False, True] and not ends
    slots[1].set_result("b")
    assert ends == [(["a", "b", "c"], None)]
    slots[1].set_result("late")  # dropped: the call has ended
    call.cancel()
    assert len(ends) == 1


def test_an_error_or_a_cancel_ends_the_call_and_every_slot():
    ends = []
    failed = UnaryCall(2, lambda results, error: ends.append(("failed", results, error)))
    slots = failed.slots()
    error = RuntimeError("boom")
    slots[0].set_exception(error)
    assert slots[1].done()  # the batcher skips the call's other inputs
    slots[1].set_result("late")
    cancelled = UnaryCall(2, lambda results, error: ends.append(("cancelled", results, error)))
    other = cancelled.slots()
    cancelled.cancel()
    assert all(s.done() for s in other)
    assert ends == [("failed", None, error), ("cancelled", None, None)]


def test_a_unary_call_and_its_slots_are_freed_without_the_cycle_collector():
    gc.collect()
    gc.disable()
    try:
        for _ in range(100):
            UnaryCall(4, lambda results, error: None).slots()[0].set_result(1)
        alive = sum(isinstance(o, UnaryCall) for o in gc.get_objects())
    finally:
        gc.enable()
    assert alive == 0


def test_the_queue_depth_gauge_is_written_once_per_turn():
    async def main():
        async with held_batcher() as (batcher, tally, _, _):
            loop = asyncio.get_running_loop()
            tally.depths.clear()
            for tag in range(50):  # one turn of the loop
                batcher.submit([item(4, tag, loop.create_future())])
            await asyncio.sleep(0)
            assert tally.depths == [50]

    asyncio.run(main())


def test_an_input_whose_caller_left_unannounced_waits_for_the_next_read_through(monkeypatch):
    """Cancelled without `note_dead`, an input stays queued until the queue is read through again; announced,
    it is dropped at the owner's next turn (and counted)."""
    monkeypatch.setattr(batcher_module, "DEAD_SCAN_S", 30.0)

    async def main():
        async with held_batcher(max_batch_size=1) as (batcher, tally, gate, _):
            loop = asyncio.get_running_loop()
            queued = [item(4, tag, loop.create_future()) for tag in (1, 2)]
            batcher.submit(queued[:1])
            batcher.submit(queued[1:])
            await asyncio.sleep(0.05)  # the owner has turned (the queue read through once, nothing dead)
            queued[0].future.cancel()
            batcher._wake()
            await asyncio.sleep(0.05)
            assert batcher.depth == 2 and not tally.dropped_counts
            batcher.note_dead()
            batcher._wake()
            deadline = time.monotonic() + 5
            while batcher.depth != 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            assert batcher.depth == 1 and tally.dropped_counts == {"cancelled": 1}
            gate.set()
            assert (await queued[1].future).value == 0

    asyncio.run(main())


def test_a_passed_deadline_is_dropped_at_the_next_turn_without_the_read_through(monkeypatch):
    monkeypatch.setattr(batcher_module, "DEAD_SCAN_S", 30.0)

    async def main():
        async with held_batcher(max_batch_size=1) as (batcher, tally, _, _):
            loop = asyncio.get_running_loop()
            late = item(4, 1, loop.create_future(), deadline=time.monotonic() + 0.05)
            batcher.submit([late])
            await asyncio.sleep(0.2)
            batcher._wake()
            with pytest.raises(Exception, match="deadline passed"):
                await asyncio.wait_for(late.future, 1)  # the first batch holds the instance 5 s
            assert tally.dropped_counts == {"deadline": 1} and batcher.depth == 0

    asyncio.run(main())


def cancelled_attention_job(announce: bool) -> tuple[Tally, list, int]:
    """An attention job queued behind a batch (held by a gate), its caller cancelled: (the tally, the job's
    runs, the queue depth one second after the cancel). `announce` False: the cancel goes unannounced."""

    async def main():
        ran = []
        async with held_batcher(max_batch_size=1) as (batcher, tally, gate, first):
            if not announce:
                batcher.note_dead = lambda: None
            job = asyncio.ensure_future(batcher.submit_exclusive(lambda: ran.append(1), 4, None))
            await asyncio.sleep(0.01)
            assert batcher.depth == 1
            job.cancel()
            await asyncio.sleep(0)
            batcher._wake()
            deadline = time.monotonic() + 1
            while batcher.depth and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            depth = batcher.depth
            gate.set()
            await first.future
        return tally, ran, depth

    return asyncio.run(main())


def test_a_cancelled_attention_job_is_dropped_at_the_next_turn(monkeypatch):
    monkeypatch.setattr(batcher_module, "DEAD_SCAN_S", 30.0)
    tally, ran, depth = cancelled_attention_job(announce=True)
    assert depth == 0 and not ran and tally.dropped_counts == {"cancelled": 1}


def test_an_attention_job_whose_caller_left_unannounced_never_runs(monkeypatch):
    monkeypatch.setattr(batcher_module, "DEAD_SCAN_S", 30.0)
    tally, ran, depth = cancelled_attention_job(announce=False)
    assert depth == 1  # still queued: no read-through yet
    assert not ran and tally.dropped_counts == {"cancelled": 1}  # skipped when its turn came


def test_every_engine_call_is_answered_once():
    """Through `Engine._handle`: a call split over batches whose compute fails, one whose deadline passes
    while queued, one cancelled by its front, one naming a model the engine lacks: one answer each, and
    nothing left held."""
    sent: list[tuple] = []

    class Front:
        def post(self, message):
            sent.append(message)

    async def main():
        gate = threading.Event()
        failing = []

        def compute(batch):
            gate.wait(5)
            if failing:
                raise RuntimeError("boom")
            return [0] * len(batch)

        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher("m", compute, limits(max_batch_size=2), pool, prefetch=0)
            batcher.start()
            engine = Engine.__new__(Engine)  # its message handling alone: no models loaded
            engine._calls = {}
            engine._groups = {"enc": types.SimpleNamespace(batcher=batcher)}
            engine.registry = types.SimpleNamespace(by_name={"m": None})
            front, ids = Front(), np.zeros(4, np.int64)
            embed = [TaskOptions(Task.EMBED)]

            def inputs(n: int, model: str = "m") -> tuple:
                return inputs_out(model, embed, [ids] * n, [ids] * n, None)

            engine._handle(front, ("submit", 1, "enc", False, None, inputs(3)))  # 2 compute, 1 queued
            while not batcher._running:
                await asyncio.sleep(0.001)
            engine._handle(front, ("submit", 2, "enc", False, time.monotonic() + 0.03, inputs(1)))
            engine._handle(front, ("submit", 3, "enc", False, None, inputs(1)))
            engine._handle(front, ("cancel", 3))
            engine._handle(front, ("submit", 4, "enc", False, None, inputs(2, "absent")))
            await asyncio.sleep(0.1)
            failing.append(True)
            gate.set()
            await asyncio.sleep(0.3)
            await batcher.close()
            await asyncio.sleep(0.01)
            assert not engine._calls and batcher.depth == 0 and batcher._room[False].used == 0

    asyncio.run(main())
    answers = sorted((message[1], message[0]) for message in sent)
    assert answers == [(1, "error"), (2, "error"), (3, "cancelled"), (4, "error")]
