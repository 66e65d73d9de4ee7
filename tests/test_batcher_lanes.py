"""The batcher's two lanes (interactive before bulk, small bulk batches beside interactive calls, no
starvation) and its instances (several batches computing at once; exclusive jobs still alone)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bertserve.service.engine import batcher as batcher_module
from bertserve.service.engine.batcher import INTERACTIVE_TURNS_PER_BULK, Batcher, BatchLimits, WorkItem
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.errors import Overloaded

EMBED = TaskOptions(Task.EMBED)


def item(length: int, tag: int, future: asyncio.Future, bulk: bool = False) -> WorkItem:
    ids = np.full(length, tag, dtype=np.int64)
    return WorkItem(ids, np.zeros(length, dtype=np.int64), EMBED, future=future, bulk=bulk)


def limits(**kw) -> BatchLimits:
    base = dict(max_batch_size=8, max_batch_tokens=10_000, max_queue_delay_s=0.0, max_queue_inputs=1000)
    return BatchLimits(**(base | kw))


class Recorder:
    """The fake model: records each batch's tags; the first batch waits for `release`."""

    def __init__(self):
        self.batches: list[list[int]] = []
        self.release = threading.Event()

    def __call__(self, batch: list[WorkItem]) -> list[int]:
        if not self.batches:
            self.release.wait(5)
        tags = [int(i.ids[0]) for i in batch]
        self.batches.append(tags)
        return tags


async def submit_each(batcher: Batcher, specs: list[tuple[int, int, bool]]) -> list[asyncio.Future]:
    """One call per (length, tag, bulk); the owner runs between calls, as with real callers."""
    loop = asyncio.get_running_loop()
    futures = []
    for length, tag, bulk in specs:
        future = loop.create_future()
        batcher.submit([item(length, tag, future, bulk)])
        futures.append(future)
        await asyncio.sleep(0)
    return futures


def run_batcher(compute, batch_limits: BatchLimits, scenario, concurrency: int = 1):
    async def main():
        with ThreadPoolExecutor(concurrency) as pool:
            batcher = Batcher("m", compute, batch_limits, pool, concurrency=concurrency)
            batcher.start()
            try:
                return await scenario(batcher)
            finally:
                await batcher.close()

    return asyncio.run(main())


@pytest.fixture
def no_prefetch(monkeypatch):
    """The lane order alone: no batch cut ahead (test_a_batch_is_cut_ahead... covers that mechanism)."""
    monkeypatch.setattr(batcher_module, "PREFETCH_BATCHES", 0)


def test_an_interactive_call_goes_before_queued_bulk_inputs(no_prefetch):
    model = Recorder()

    async def scenario(batcher):
        bulk = await submit_each(batcher, [(5, tag, True) for tag in range(12)])  # first batch computing
        interactive = await submit_each(batcher, [(5, 100, False)])
        model.release.set()
        await asyncio.gather(*bulk, *interactive)

    run_batcher(model, limits(max_batch_size=4), scenario)
    assert model.batches[0] == [0]  # computing when the other bulk inputs and the interactive call came
    assert model.batches[1] == [100]  # ahead of the 11 bulk inputs queued before it
    assert sorted(t for b in model.batches[2:] for t in b) == list(range(1, 12))


def test_bulk_batches_are_small_only_while_interactive_calls_are_active(monkeypatch, no_prefetch):
    def bulk_batch_sizes(recent_s: float) -> list[int]:
        monkeypatch.setattr(batcher_module, "INTERACTIVE_RECENT_S", recent_s)
        model = Recorder()

        async def scenario(batcher):
            first = await submit_each(batcher, [(5, 100, False)])  # an interactive call, computing
            bulk = await submit_each(batcher, [(5, tag, True) for tag in range(8)])
            model.release.set()
            await asyncio.gather(*first, *bulk)

        run_batcher(model, limits(max_batch_tokens=10_000, max_bulk_batch_tokens=10), scenario)
        assert model.batches[0] == [100]
        return [len(b) for b in model.batches[1:]]

    assert bulk_batch_sizes(recent_s=60.0) == [2, 2, 2, 2]  # 10 padded tokens: two inputs of 5
    assert bulk_batch_sizes(recent_s=0.0) == [8]  # nobody interactive: max_batch_tokens


def test_bulk_inputs_are_not_starved_by_interactive_calls(no_prefetch):
    model = Recorder()

    async def scenario(batcher):
        first = await submit_each(batcher, [(5, 0, False)])
        rest = await submit_each(batcher, [(5, tag, False) for tag in range(1, 10)] + [(5, 99, True)])
        model.release.set()
        await asyncio.gather(*first, *rest)

    run_batcher(model, limits(max_batch_size=1), scenario)
    order = [b[0] for b in model.batches]
    # the computing batch, then INTERACTIVE_TURNS_PER_BULK interactive batches, then the bulk input
    assert order.index(99) == 1 + INTERACTIVE_TURNS_PER_BULK
    assert order == [*range(1 + INTERACTIVE_TURNS_PER_BULK), 99, *range(1 + INTERACTIVE_TURNS_PER_BULK, 10)]


class CountingPool(ThreadPoolExecutor):
    """Counts the batches handed to it (computing, or waiting for its thread)."""

    def __init__(self, workers: int):
        super().__init__(workers)
        self.handed = 0

    def submit(self, fn, *args, **kwargs):
        self.handed += 1
        return super().submit(fn, *args, **kwargs)


def test_a_batch_is_cut_ahead_so_the_instance_never_waits_for_the_event_loop():
    """While a batch computes, the next one is already handed to the executor: it starts the moment the
    instance is free, without a round trip through the (busy) event loop."""
    model = Recorder()

    async def main():
        with CountingPool(1) as pool:
            batcher = Batcher("m", model, limits(max_batch_size=1), pool)
            batcher.start()
            futures = await submit_each(batcher, [(5, tag, False) for tag in range(3)])
            await asyncio.sleep(0.05)  # the first batch is held by the model
            in_executor = pool.handed
            model.release.set()
            await asyncio.gather(*futures)
            await batcher.close()
        return in_executor

    assert asyncio.run(main()) == 1 + batcher_module.PREFETCH_BATCHES == 2  # computing + one cut ahead
    assert model.batches == [[0], [1], [2]]


def test_without_prefetch_only_a_full_batch_is_cut_ahead():
    """The engine's batcher (prefetch 0, ahead_when_full): while a batch computes, the queue grows into the
    next batch; once it holds a full one (max_batch_size inputs, or max_batch_tokens tokens) that batch is
    handed to the executor at once, so the instance never waits for the (busy) event loop for it."""

    def handed_while_computing(ahead_when_full: bool, specs: list[tuple[int, int, bool]], **kw) -> int:
        model = Recorder()

        async def main():
            with CountingPool(1) as pool:
                batcher = Batcher("m", model, limits(**kw), pool, prefetch=0, ahead_when_full=ahead_when_full)
                batcher.start()
                futures = await submit_each(batcher, specs[:1])
                await asyncio.sleep(0.05)  # the first batch is held by the model
                futures += await submit_each(batcher, specs[1:])
                await asyncio.sleep(0.05)
                in_executor = pool.handed
                model.release.set()
                await asyncio.gather(*futures)
                await batcher.close()
            return in_executor

        return asyncio.run(main())

    three = [(5, tag, False) for tag in range(3)]
    assert handed_while_computing(True, three[:2], max_batch_size=2) == 1  # one queued: it may still grow
    assert handed_while_computing(True, three, max_batch_size=2) == 2  # two queued: full, cut ahead
    assert handed_while_computing(True, three, max_batch_tokens=10) == 2  # 10 tokens queued: full
    assert handed_while_computing(False, three, max_batch_size=2) == 1  # plain prefetch 0: never ahead


def owner_turns(monkeypatch) -> list[int]:
    """The owner's turns from now on, each as the inputs it found arrived since the last."""
    turns: list[int] = []
    step = Batcher._step

    async def counted(self):
        turns.append(len(self._incoming))
        return await step(self)

    monkeypatch.setattr(Batcher, "_step", counted)
    return turns


def test_bulk_inputs_beside_interactive_calls_never_wake_the_engines_owner(monkeypatch):
    """A full bulk batch is not cut ahead while interactive calls are active (`_may_start`), so the bulk
    inputs that fill it do not wake the owner either: no turn of the owner per call."""
    model = Recorder()
    turns = owner_turns(monkeypatch)

    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher("m", model, limits(max_batch_size=2), pool, prefetch=0, ahead_when_full=True)
            batcher.start()
            futures = await submit_each(batcher, [(5, 0, False)])  # interactive: computing, held by the model
            await asyncio.sleep(0.05)
            before = len(turns)
            futures += await submit_each(batcher, [(5, tag, True) for tag in range(1, 21)])
            await asyncio.sleep(0.05)
            during = len(turns) - before
            model.release.set()
            await asyncio.gather(*futures)
            await batcher.close()
        return during

    assert asyncio.run(main()) == 0


def test_calls_that_arrive_while_every_instance_is_taken_do_not_wake_the_owner(monkeypatch):
    """With a batch computing and one cut ahead, the owner can start nothing: calls queue without a turn of
    the owner each, and the batch that finishes wakes it to cut the next from all of them."""
    model = Recorder()
    turns = owner_turns(monkeypatch)

    async def scenario(batcher):
        futures = await submit_each(batcher, [(5, tag, False) for tag in range(2)])
        await asyncio.sleep(0.05)  # one batch computes (held by the model), one waits cut ahead
        before = len(turns)
        futures += await submit_each(batcher, [(5, tag, False) for tag in range(2, 6)])
        await asyncio.sleep(0.05)
        during = len(turns) - before
        model.release.set()
        assert [r.value for r in await asyncio.gather(*futures)] == list(range(6))
        return during

    assert run_batcher(model, limits(max_batch_size=4), scenario) == 0
    assert model.batches == [[0], [1], [2, 3, 4, 5]]


def test_no_bulk_batch_is_cut_ahead_of_an_interactive_call(monkeypatch):
    """While interactive calls are active, a stream's batch is never cut ahead: an interactive call that
    arrives waits for the batch computing only."""
    monkeypatch.setattr(batcher_module, "INTERACTIVE_RECENT_S", 60.0)
    model = Recorder()

    async def scenario(batcher):
        first = await submit_each(batcher, [(5, 100, False)])  # interactive: computing, held by the model
        bulk = await submit_each(batcher, [(5, tag, True) for tag in range(4)])
        await asyncio.sleep(0.05)
        interactive = await submit_each(batcher, [(5, 101, False)])
        model.release.set()
        await asyncio.gather(*first, *bulk, *interactive)

    run_batcher(model, limits(max_batch_size=1), scenario)
    assert model.batches[:2] == [[100], [101]]


def test_instances_compute_batches_at_the_same_time_and_exclusive_jobs_alone():
    both = threading.Barrier(2, timeout=5)  # broken (and the test failed) unless two batches meet here
    computing = []  # batches computing, seen by each exclusive job
    lock = threading.Lock()
    running = [0]

    def model(batch):
        with lock:
            running[0] += 1
        try:
            if int(batch[0].ids[0]) < 2:
                both.wait()
            return [int(i.ids[0]) for i in batch]
        finally:
            with lock:
                running[0] -= 1

    def exclusive():
        with lock:
            computing.append(running[0])
        return "attention"

    async def scenario(batcher):
        futures = await submit_each(batcher, [(5, 0, False), (5, 1, False)])
        jobs = [asyncio.ensure_future(batcher.submit_exclusive(exclusive, 5, None)) for _ in range(3)]
        futures += await submit_each(batcher, [(5, tag, tag % 2 == 0) for tag in range(2, 12)])
        results = await asyncio.gather(*futures, *jobs)
        return [r.value for r in results]

    values = run_batcher(model, limits(max_batch_size=1), scenario, concurrency=2)
    assert values == list(range(12)) + ["attention"] * 3
    assert computing == [0, 0, 0]  # never beside a batch


def test_with_instances_bulk_batches_leave_one_free_for_interactive_calls():
    release_bulk = threading.Event()

    def model(batch):
        if batch[0].bulk:
            release_bulk.wait(10)
        return [int(i.ids[0]) for i in batch]

    async def scenario(batcher):
        await asyncio.gather(*await submit_each(batcher, [(5, 0, False)]))  # interactive calls are active
        bulk = await submit_each(batcher, [(5, tag, True) for tag in range(1, 5)])
        # one instance computes a bulk batch; the other stays free, so this call is answered at once
        late = await submit_each(batcher, [(5, 9, False)])
        answered = await asyncio.wait_for(late[0], 5)
        still_queued = batcher.depth
        release_bulk.set()
        await asyncio.gather(*bulk)
        return answered.value, still_queued

    value, still_queued = run_batcher(model, limits(max_batch_size=1), scenario, concurrency=2)
    assert value == 9
    assert (
        still_queued == 3
    )  # the other bulk inputs waited: one bulk batch at a time beside interactive calls


def test_with_instances_free_the_queued_inputs_are_shared_out():
    both = threading.Barrier(2, timeout=5)
    sizes = []

    def model(batch):
        sizes.append(len(batch))
        if len(sizes) <= 2:
            both.wait()  # the first two batches compute side by side
        return [int(i.ids[0]) for i in batch]

    async def scenario(batcher):
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(8)]
        batcher.submit([item(5, tag, future) for tag, future in enumerate(futures)])  # one call of 8
        return [r.value for r in await asyncio.gather(*futures)]

    assert run_batcher(model, limits(max_batch_size=32), scenario, concurrency=2) == list(range(8))
    assert sizes == [4, 4]


def test_streams_filling_their_queue_never_refuse_unary_calls():
    """Each lane has its own max_queue_inputs: bulk inputs up to the bound leave room for unary calls."""
    release = threading.Event()

    def model(batch):
        release.wait(10)
        return [int(i.ids[0]) for i in batch]

    async def scenario(batcher):
        loop = asyncio.get_running_loop()
        bulk = [item(5, tag, loop.create_future(), bulk=True) for tag in range(4)]
        batcher.submit(bulk)  # the stream lane is full
        refused = None
        try:
            batcher.submit([item(5, 9, loop.create_future(), bulk=True)])
        except Overloaded as error:
            refused = str(error)
        unary = [item(5, 7, loop.create_future())]
        batcher.submit(unary)  # admitted all the same
        release.set()
        results = await asyncio.gather(*(i.future for i in bulk + unary))
        return refused, [r.value for r in results]

    refused, values = run_batcher(model, limits(max_queue_inputs=4), scenario)
    assert refused is not None and "stream queue holds 4 of max_queue_inputs 4" in refused
    assert values == [0, 1, 2, 3, 7]


def test_room_is_taken_before_work_and_streams_wait_for_it_in_arrival_order():
    """Permits (service/engine/queue_room.py): a unary call's room is taken at once or refused, counting inputs
    still being tokenized; a stream's request waits for room, in arrival order; a cancelled waiter gives
    its turn away, and room comes back when inputs leave the queue or a permit is released unused."""
    recorder = Recorder()

    async def scenario(batcher: Batcher):
        loop = asyncio.get_running_loop()
        held = batcher.reserve(3)  # a unary call being tokenized
        with pytest.raises(Overloaded, match="being tokenized"):
            batcher.reserve(2)  # 3 + 2 > 4, though nothing is queued yet
        held.release()
        held.release()  # once only
        batcher.reserve(4).release()

        first = await batcher.wait_room(4, bulk=True)
        waiters = [asyncio.ensure_future(batcher.wait_room(n, bulk=True)) for n in (3, 1, 2)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiters)
        waiters[0].cancel()  # the 3 at the head leaves: the 1 and the 2 go next, in order
        futures = [loop.create_future() for _ in range(4)]
        batcher.submit([item(5, k, f, bulk=True) for k, f in enumerate(futures)], first)
        recorder.release.set()
        await asyncio.gather(*futures)  # computed: their room came back
        second, third = await asyncio.gather(waiters[1], waiters[2])
        assert (second.inputs, third.inputs) == (1, 2)
        with pytest.raises(Overloaded, match="more than max_queue_inputs"):
            await batcher.wait_room(5, bulk=True)  # can never fit: refused at once
        second.release()
        third.release()
        assert (await batcher.wait_room(4, bulk=True)).inputs == 4

    run_batcher(recorder, limits(max_queue_inputs=4), scenario)
