"""The dynamic batcher on its own, with a fake model: batching rules, order, admission, drops, failures."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bertserve.service.engine.batch_policy import CostEstimate
from bertserve.service.engine.batcher import Batcher, BatchLimits, BatchObserver, WorkItem, cut_batch
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.errors import DeadlineTooShort, InferenceFailed, Overloaded, ShuttingDown

EMBED = TaskOptions(Task.EMBED)


def item(length: int, tag: int = 0, deadline: float | None = None, future=None) -> WorkItem:
    ids = np.full(length, tag, dtype=np.int64)
    return WorkItem(ids, np.zeros(length, dtype=np.int64), EMBED, future=future, deadline=deadline)


class Tally(BatchObserver):
    def __init__(self):
        self.batches: list[int] = []
        self.dropped_counts: dict[str, int] = {}

    def dropped(self, reason, count):
        self.dropped_counts[reason] = self.dropped_counts.get(reason, 0) + count

    def batch_done(self, stats):
        self.batches.append(stats.size)


def echo_tags(batch):
    """The fake model: each input's result is its tag (first id); the padded shape is checked."""
    longest = max(i.length for i in batch)
    assert all(i.length <= longest for i in batch)
    return [int(i.ids[0]) for i in batch]


def limits(**kw):
    base = dict(max_batch_size=8, max_batch_tokens=10_000, max_queue_delay_s=0.005, max_queue_inputs=1000)
    base.update(kw)
    return BatchLimits(**base)


def run(coro):
    return asyncio.run(coro)


def test_cut_batch_takes_oldest_and_groups_lengths():
    pending = [item(n) for n in (50, 10, 11, 49, 12, 48, 51)]
    chosen = cut_batch(pending, max_size=4, max_tokens=10_000)
    assert 0 in chosen
    assert sorted(pending[i].length for i in chosen) == [48, 49, 50, 51]


def test_cut_batch_respects_token_budget_and_size():
    pending = [item(n) for n in (30, 30, 30, 30, 30)]
    assert len(cut_batch(pending, max_size=8, max_tokens=95)) == 3  # 30 x 3 = 90 <= 95 < 120
    assert len(cut_batch(pending, max_size=2, max_tokens=10_000)) == 2
    assert cut_batch([item(500), item(5)], max_size=8, max_tokens=100) == [0]  # alone when over budget


def test_cut_batch_keeps_padding_within_the_ratio():
    pending = [item(n) for n in (10, 40, 11, 38, 10)]
    first = cut_batch(pending, max_size=8, max_tokens=10_000, max_padding_ratio=1.2)
    assert first == [0, 2, 4]  # 10, 11, 10: padded 33 <= 1.2 x 31; a 38 or 40 would not fit
    rest = [pending[i] for i in (1, 3)]
    assert cut_batch(rest, max_size=8, max_tokens=10_000, max_padding_ratio=1.2) == [0, 1]
    assert len(cut_batch(pending, max_size=8, max_tokens=10_000)) == 5  # no ratio: everything


def test_results_come_back_in_order_across_batches():
    async def main():
        observer = Tally()
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher("m", echo_tags, limits(max_batch_size=4), pool, observer)
            batcher.start()
            loop = asyncio.get_running_loop()
            lengths = [7, 3, 20, 5, 9, 3, 11, 2, 15, 4]
            items = [item(n, tag=k, future=loop.create_future()) for k, n in enumerate(lengths)]
            batcher.submit(items)
            results = await asyncio.gather(*(i.future for i in items))
            await batcher.close()
        assert [r.value for r in results] == list(range(len(lengths)))
        assert sum(observer.batches) == len(lengths) and max(observer.batches) == 4
        assert len({r.batch_id for r in results}) >= 3

    run(main())


def test_concurrent_calls_share_batches():
    async def main():
        observer = Tally()
        gate = threading.Event()

        def slow(batch):
            gate.wait(5)
            return echo_tags(batch)

        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher("m", slow, limits(max_batch_size=16), pool, observer)
            batcher.start()
            loop = asyncio.get_running_loop()
            calls = [[item(5 + k % 3, tag=k, future=loop.create_future())] for k in range(20)]
            for call in calls:
                batcher.submit(call)
                await asyncio.sleep(0)  # let the owner run between callers, as real calls would
            gate.set()
            results = await asyncio.gather(*(c[0].future for c in calls))
            await batcher.close()
        assert [r.value for r in results] == list(range(20))
        assert max(observer.batches) > 1

    run(main())


def test_full_queue_refuses_at_once():
    async def main():
        gate = threading.Event()
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(
                "m", lambda b: (gate.wait(5), echo_tags(b))[1], limits(max_queue_inputs=3), pool
            )
            batcher.start()
            loop = asyncio.get_running_loop()
            first = [item(4, future=loop.create_future()) for _ in range(3)]
            batcher.submit(first)
            started = time.perf_counter()
            with pytest.raises(Overloaded, match="max_queue_inputs 3"):
                batcher.submit([item(4, future=loop.create_future())])
            # refused without waiting for room (the gate holds the worker for 5 s); the slack is scheduling
            assert time.perf_counter() - started < 1.0
            gate.set()
            await asyncio.gather(*(i.future for i in first))
            batcher.submit([item(4, future=loop.create_future())])  # room again
            await batcher.close()
            with pytest.raises(ShuttingDown):
                batcher.submit([item(4, future=loop.create_future())])

    run(main())


def test_cancelled_and_expired_inputs_never_reach_the_model():
    async def main():
        observer = Tally()
        seen: list[int] = []
        gate = threading.Event()

        def model(batch):
            gate.wait(5)
            seen.extend(int(i.ids[0]) for i in batch)
            return echo_tags(batch)

        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher("m", model, limits(max_batch_size=1, max_queue_delay_s=0), pool, observer)
            batcher.start()
            loop = asyncio.get_running_loop()
            blocker = item(3, tag=1, future=loop.create_future())
            batcher.submit([blocker])
            await asyncio.sleep(0.05)  # the blocker is computing, behind the gate
            cancelled = item(3, tag=2, future=loop.create_future())
            expired = item(3, tag=3, future=loop.create_future(), deadline=time.monotonic() + 0.01)
            kept = item(3, tag=4, future=loop.create_future())
            batcher.submit([cancelled])
            batcher.submit([expired])
            batcher.submit([kept])
            cancelled.future.cancel()
            await asyncio.sleep(0.05)  # the deadline passes while queued
            gate.set()
            assert (await kept.future).value == 4
            with pytest.raises(DeadlineTooShort):
                await expired.future
            await batcher.close()
        assert seen == [1, 4]
        assert observer.dropped_counts == {"cancelled": 1, "deadline": 1}

    run(main())


def test_a_failing_batch_fails_only_its_calls():
    async def main():
        def model(batch):
            if any(i.ids[0] == 666 for i in batch):
                raise RuntimeError("kaput")
            return echo_tags(batch)

        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher("m", model, limits(max_batch_size=1), pool)
            batcher.start()
            loop = asyncio.get_running_loop()
            bad, good = (
                item(3, tag=666, future=loop.create_future()),
                item(3, tag=7, future=loop.create_future()),
            )
            batcher.submit([bad])
            batcher.submit([good])
            with pytest.raises(InferenceFailed, match="kaput"):
                await bad.future
            assert (await good.future).value == 7
            await batcher.close()

    run(main())


def test_waits_at_most_the_queue_delay_for_company():
    async def main():
        with ThreadPoolExecutor(1) as pool:
            # a delay long enough that a loaded machine's scheduling hiccup is not mistaken for it
            batcher = Batcher("m", echo_tags, limits(max_queue_delay_s=1.0), pool)
            batcher.start()
            loop = asyncio.get_running_loop()
            lone = item(3, future=loop.create_future())
            started = time.perf_counter()
            batcher.submit([lone])
            result = await lone.future
            waited = time.perf_counter() - started
            assert 0.9 < waited < 5.0 and result.queue_s >= 0.9
            full = [item(3, tag=k, future=loop.create_future()) for k in range(8)]  # max_batch_size 8
            started = time.perf_counter()
            batcher.submit(full)
            await asyncio.gather(*(i.future for i in full))
            assert time.perf_counter() - started < 0.9  # a full batch does not wait
            await batcher.close()

    run(main())


def test_deadline_too_short_for_the_queue_is_refused_early():
    async def main():
        gate = threading.Event()

        def slow(batch):
            gate.wait(5)
            time.sleep(0.05)  # the fake model's compute time
            return echo_tags(batch)

        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher("m", slow, limits(max_batch_size=1, max_queue_delay_s=0), pool)
            batcher.start()
            loop = asyncio.get_running_loop()
            gate.set()
            first = item(10, future=loop.create_future())
            batcher.submit([first])
            await first.future  # now the batcher knows about 5 ms per token
            gate.clear()
            queued = [item(10, tag=k, future=loop.create_future()) for k in range(5)]
            for one in queued:
                batcher.submit([one])
            assert batcher.estimated_wait_s(10) > 0.2
            with pytest.raises(DeadlineTooShort, match="queue ahead needs"):
                batcher.submit([item(10, future=loop.create_future(), deadline=time.monotonic() + 0.05)])
            batcher.submit([item(10, future=loop.create_future(), deadline=time.monotonic() + 30)])
            gate.set()
            await asyncio.gather(*(one.future for one in queued))
            await batcher.close()

    run(main())


def test_abort_fails_computing_and_queued_inputs():
    async def main():
        gate = threading.Event()
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher("m", lambda b: (gate.wait(5), echo_tags(b))[1], limits(max_batch_size=1), pool)
            batcher.start()
            loop = asyncio.get_running_loop()
            computing, queued = (item(3, future=loop.create_future()) for _ in range(2))
            batcher.submit([computing])
            batcher.submit([queued])
            await asyncio.sleep(0.05)  # the first is inside the model
            await batcher.abort()
            gate.set()
            for one in (computing, queued):
                with pytest.raises(ShuttingDown):
                    await one.future
            assert batcher.depth == 0

    run(main())


# --- exclusive jobs (attention runs) and the cost estimate -------------------------------------------


ATTENTION_RUN_S = 0.3


def test_exclusive_jobs_alternate_with_batches_and_report_true_times():
    """A batch queued behind five attention runs waits for at most one of them; its queue time is that
    wait and its inference time its own compute."""

    async def main():
        gate, order = threading.Event(), []

        def compute(batch):
            gate.wait(5)
            order.append("batch")
            return echo_tags(batch)

        def attention_run(k):
            def run():
                time.sleep(ATTENTION_RUN_S)
                order.append(f"attention{k}")
                return k

            return run

        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher("m", compute, limits(max_queue_delay_s=0), pool)
            batcher.start()
            loop = asyncio.get_running_loop()
            blocker = item(3, future=loop.create_future())
            batcher.submit([blocker])
            runs = [
                asyncio.ensure_future(batcher.submit_exclusive(attention_run(k), 10, None)) for k in range(5)
            ]
            await asyncio.sleep(0.01)
            assert batcher.depth == 5
            queued = item(4, tag=7, future=loop.create_future())
            batcher.submit([queued])
            gate.set()
            result = await queued.future
            assert order[:3] == ["batch", "attention0", "batch"]
            # long attention runs, so that a loaded machine's slack on the batches stays far below them
            assert result.value == 7 and result.queue_s >= 0.9 * ATTENTION_RUN_S
            assert result.inference_s < 0.7 * ATTENTION_RUN_S
            assert [r.value for r in await asyncio.gather(*runs)] == list(range(5))
            assert all(r.inference_s >= 0.9 * ATTENTION_RUN_S for r in await asyncio.gather(*runs))
            # the estimate comes from batches only: two batches that took about nothing (counting the
            # attention runs would make it at least ATTENTION_RUN_S / 10 tokens)
            assert batcher.cost.seconds_per_token < ATTENTION_RUN_S / 10
            await batcher.close()

    run(main())


def test_exclusive_queue_limit_and_cancelled_job_never_runs():
    async def main():
        gate, ran = threading.Event(), []
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(
                "m", lambda b: (gate.wait(5), echo_tags(b))[1], limits(max_queue_exclusive=2), pool
            )
            batcher.start()
            loop = asyncio.get_running_loop()
            batcher.submit([item(3, future=loop.create_future())])  # holds the worker
            await asyncio.sleep(0.02)
            kept = asyncio.ensure_future(batcher.submit_exclusive(lambda: ran.append("kept"), 5, None))
            dropped = asyncio.ensure_future(batcher.submit_exclusive(lambda: ran.append("dropped"), 5, None))
            await asyncio.sleep(0.01)
            with pytest.raises(Overloaded, match="max_queue_attention 2"):
                await batcher.submit_exclusive(lambda: None, 5, None)
            dropped.cancel()
            gate.set()
            await kept
            await batcher.close()
            assert ran == ["kept"] and batcher.depth == 0

    run(main())


def test_never_refused_for_its_deadline_with_nothing_ahead():
    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher("m", echo_tags, limits(), pool)
            batcher.start()
            for _ in range(16):
                batcher.cost.add(seconds=100.0, padded_tokens=1)  # a planted, absurdly slow period
            loop = asyncio.get_running_loop()
            big = [item(256, future=loop.create_future(), deadline=time.monotonic() + 30) for _ in range(64)]
            batcher.submit(big)  # empty queue: accepted although the estimate says 1.6 million seconds
            await asyncio.gather(*(one.future for one in big))
            await batcher.close()

    run(main())


def test_cost_estimate_follows_recent_batches():
    estimate = CostEstimate(window=16)
    assert estimate.seconds_per_token is None
    for _ in range(16):
        estimate.add(2.0, 100)  # a slow period: 20 ms per token
    assert estimate.seconds_per_token == pytest.approx(0.02)
    for _ in range(9):  # a majority of the window at 0.1 ms per token
        estimate.add(0.01, 100)
    assert estimate.seconds_per_token == pytest.approx(0.0001)
