"""Cutting batches by cost (setting `batch_cut`): the fitted batch cost, `cut_by_cost`'s choices and limits,
and the batcher and encoder groups that use them."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bertserve.service.engine.batch_policy import BatchCostFit, cut_batch, cut_by_cost
from bertserve.service.engine.batcher import Batcher, BatchLimits, BatchObserver, WorkItem
from bertserve.service.engine.shapes import buckets
from bertserve.service.engine.simulated_device import SimulatedSession
from bertserve.service.engine.tasks import Task, TaskOptions
from tests.helpers.server import ServerThread

BUCKETS = buckets(64, 16384, 256)  # the GPU overlay's limits and MiniLM's longest input
LADDERS = (BUCKETS.rows, BUCKETS.lengths)
GPU_LINE = (0.45e-3, 0.5e-6)  # seconds per batch and per padded token: about an H200's MiniLM batches
# token lengths of a mixed corpus: mostly short, a few long (as bench/corpus/mixed.txt under MiniLM)
LENGTHS = [9, 12, 14, 17, 20, 23, 26, 31, 35, 40, 47, 55, 63, 80, 110, 150, 199]


def item(length: int, tag: int = 0, future=None) -> WorkItem:
    ids = np.full(length, tag, dtype=np.int64)
    return WorkItem(ids, np.zeros(length, dtype=np.int64), TaskOptions(Task.EMBED), future=future)


def by_cost(pending, line=GPU_LINE, max_size=64, max_tokens=16384, ratio=4.0):
    return cut_by_cost(pending, max_size, max_tokens, ratio, LADDERS, BUCKETS.shape, line)


def test_the_oldest_is_always_taken_and_every_limit_holds():
    pick = random.Random(5)
    for trial in range(300):
        pending = [item(pick.choice(LENGTHS)) for _ in range(pick.randint(1, 200))]
        size, tokens, ratio = (
            pick.choice((1, 3, 16, 64)),
            pick.choice((256, 2048, 16384)),
            pick.choice((1.2, 4.0)),
        )
        chosen = by_cost(pending, (pick.uniform(0, 2e-3), pick.uniform(1e-8, 1e-5)), size, tokens, ratio)
        assert chosen == sorted(set(chosen)) and 0 in chosen, trial
        longest, real = max(pending[i].length for i in chosen), sum(pending[i].length for i in chosen)
        assert len(chosen) <= size, trial
        assert len(chosen) == 1 or (longest * len(chosen) <= tokens and longest * len(chosen) <= ratio * real)


def test_a_long_input_is_not_padded_with_the_short_ones_but_goes_with_its_like():
    pending = [item(60)] + [item(n) for n in [55, 60, 65, 58, 62] * 6] + [item(199)]
    assert 31 not in by_cost(pending)  # 31 inputs of ~60 tokens, not 32 padded to 256
    assert 31 in cut_batch(pending, 64, 16384, 4.0)  # what padding alone (the GPU overlay's 4) would do
    long_first = [item(199), item(190), item(180), item(185)] + [item(20)] * 28
    assert by_cost(long_first) == [0, 1, 2, 3]  # the short ones wait for a batch of their own


def test_a_batch_of_the_oldest_inputs_own_length_is_a_candidate():
    pending = [item(n) for n in (7, 158, 23, 7, 8)]
    assert by_cost(pending, ratio=1.05) == [0, 3]  # the cut at 8 would bring the 8 in, over 1.05


def test_the_buckets_a_batch_is_padded_to_decide_its_cost():
    pending = [item(20) for _ in range(17)]  # 17 rows pad to a bucket of 24, 16 fill one of 16
    exact = cut_by_cost(pending, 64, 16384, 4.0, LADDERS, lambda rows, length: (rows, length), GPU_LINE)
    assert len(exact) == 17 and len(by_cost(pending)) == 16


def test_a_dear_fixed_cost_keeps_a_small_queue_in_one_batch():
    pending = [item(n) for n in (12, 30, 9, 150, 47)]
    assert by_cost(pending, line=(20e-3, 0.5e-6)) == [0, 1, 2, 3, 4]  # a launch outweighs any padding
    assert by_cost(pending, line=(0.0, 0.5e-6)) != [0, 1, 2, 3, 4]  # padding alone: split


def _closed_loop_seconds(cut, queue: int, inputs: int = 6000) -> float:
    """Device seconds to compute `inputs` inputs, `queue` callers sending again as soon as answered."""
    pick = random.Random(7)
    pending, done, seconds = [item(pick.choice(LENGTHS)) for _ in range(queue)], 0, 0.0
    while done < inputs:
        chosen = set(cut(pending))
        batch = [pending[i] for i in sorted(chosen)]
        pending = [one for i, one in enumerate(pending) if i not in chosen]
        rows, length = BUCKETS.shape(len(batch), max(one.length for one in batch))
        seconds += GPU_LINE[0] + GPU_LINE[1] * rows * length
        done += len(batch)
        pending += [item(pick.choice(LENGTHS)) for _ in batch]
    return seconds


@pytest.mark.parametrize("queue", [16, 64, 256])
def test_cutting_by_cost_computes_a_closed_loop_faster_than_by_padding(queue):
    """On the line it was given, cutting by cost beats padding's cut at any ratio tried (scoring by cost per
    real token instead, which favours long inputs, was slower than padding's cut at 256)."""
    cost = _closed_loop_seconds(by_cost, queue)
    for ratio in (1.5, 4.0):
        assert cost < 0.97 * _closed_loop_seconds(lambda p, r=ratio: cut_batch(p, 64, 16384, r), queue)


def test_the_fit_finds_a_line_through_noisy_batches():
    fit, pick = BatchCostFit(window=64, min_points=8), random.Random(3)
    for _ in range(7):
        fit.add(1e-3, 1000)
    assert fit.fit is None  # too few batches
    for _ in range(200):
        tokens = pick.randint(16, 16384)
        fit.add((0.45e-3 + 0.5e-6 * tokens) * pick.uniform(0.95, 1.05), tokens)
    fixed, per_token = fit.fit
    assert fixed == pytest.approx(0.45e-3, rel=0.25) and per_token == pytest.approx(0.5e-6, rel=0.1)


def test_a_few_stalled_batches_leave_the_line_where_it_was():
    fit, pick = BatchCostFit(window=64, min_points=8), random.Random(4)
    for k in range(64):
        tokens = pick.randint(16, 16384)
        stalled = k in (10, 30, 50)  # a GC pause or a noisy neighbour in a large batch
        fit.add(0.45e-3 + 0.5e-6 * tokens * pick.uniform(0.97, 1.03) + (20e-3 if stalled else 0), tokens)
    fixed, per_token = fit.fit
    assert fixed == pytest.approx(0.45e-3, rel=0.3) and per_token == pytest.approx(0.5e-6, rel=0.1)


def test_batches_all_alike_keep_the_last_line_and_a_seed_starts_one():
    fit = BatchCostFit(window=16, min_points=8)
    fit.seed([(tokens, 1e-3 + 1e-6 * tokens) for tokens in (64, 512, 4096, 16384)])
    assert fit.fit == pytest.approx((1e-3, 1e-6))
    for _ in range(64):
        fit.add(9.0, 2048)  # one shape, slow: no line through it
    assert fit.fit == pytest.approx((1e-3, 1e-6))
    for tokens in (64, 16384) * 8:
        fit.add(2e-3 if tokens == 64 else 3e-3, tokens)  # a flat line: the fixed cost is all
    assert fit.fit[0] == pytest.approx(2e-3 - fit.fit[1] * 64)


def test_the_batcher_cuts_by_cost_once_it_has_a_line():
    async def main(ladders):
        gate, seen = threading.Event(), []

        def compute(batch):
            gate.wait(5)
            seen.append(sorted(one.length for one in batch))
            return [0] * len(batch)

        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher("m", compute, BatchLimits(64, 16384, 0.0, 1000, 4.0), pool, concurrency=1)
            batcher.padded_shape, batcher.cut_ladders = BUCKETS.shape, ladders
            batcher.cost_fit.seed([(t, GPU_LINE[0] + GPU_LINE[1] * t) for t in (64, 1024, 16384)])
            batcher.start()
            loop = asyncio.get_running_loop()
            first = [item(5, future=loop.create_future())]
            batcher.submit(first)  # computes alone, held at the gate while the rest queues
            await asyncio.sleep(0.05)
            rest = [item(n, future=loop.create_future()) for n in [55, 60, 65, 58] * 6 + [199]]
            batcher.submit(rest)
            gate.set()
            await asyncio.gather(*(one.future for one in first + rest))
            await batcher.close()
        return seen

    by_cost_batches, by_padding = asyncio.run(main(LADDERS))[1:], asyncio.run(main(None))[1:]
    assert [199] in by_cost_batches and sum(map(len, by_cost_batches)) == 25
    assert by_padding == [sorted([55, 60, 65, 58] * 6 + [199])]  # padding's cut: one batch, 25 x 199


def test_the_batcher_cuts_by_padding_until_its_own_batches_give_a_line():
    class Lines(BatchObserver):
        def __init__(self):
            self.lines = []

        def batch_cost(self, fixed_s, token_s):
            self.lines.append((fixed_s, token_s))

    observer = Lines()

    async def main():
        seen = []

        def compute(batch):
            time.sleep(0.4e-3 + 20e-6 * len(batch) * max(one.length for one in batch))  # a line to find
            seen.append(sorted(one.length for one in batch))
            return [0] * len(batch)

        with ThreadPoolExecutor(1) as pool:
            limits = BatchLimits(64, 16384, 0.0, 1000, 4.0)
            batcher = Batcher("m", compute, limits, pool, observer, concurrency=1)
            batcher.padded_shape, batcher.cut_ladders = BUCKETS.shape, LADDERS
            batcher.start()
            loop = asyncio.get_running_loop()
            for k in range(12):  # one call at a time: batches of its own inputs, of several sizes
                calls = [item(5 + 9 * k, future=loop.create_future()) for _ in range(1 + k % 4)]
                batcher.submit(calls)
                await asyncio.gather(*(one.future for one in calls))
            assert batcher.cost_fit.fit is not None  # from its own batches, nothing seeded
            rest = [item(n, future=loop.create_future()) for n in [55, 60, 65, 58] * 6 + [199]]
            batcher.submit(rest)
            await asyncio.gather(*(one.future for one in rest))
            await batcher.close()
        return seen

    assert [199] in asyncio.run(main())[12:]  # cut by cost once the line was drawn
    assert observer.lines and all(fixed >= 0 and token > 0 for fixed, token in observer.lines)  # its metric


def test_batch_cut_auto_cuts_by_cost_with_buckets_only(tiny_repo):
    for shapes, cut, by_cost_expected in [
        ("buckets", "auto", True),
        ("exact", "auto", False),
        ("exact", "cost", True),
        ("buckets", "padding", False),
    ]:
        with ServerThread(model_repo=tiny_repo, workers=1, batch_shapes=shapes, batch_cut=cut) as server:
            batcher = server.server.core.encoders[0].batcher
            assert (batcher.cut_ladders is not None) == by_cost_expected, (shapes, cut)


def test_a_simulated_batch_takes_longer_by_its_padded_tokens(tiny_repo):
    with ServerThread(model_repo=tiny_repo, workers=1, simulated_device_ms=1) as server:
        real = server.server.core.encoders[0].session.real
    session = SimulatedSession(real, 0.0, us_per_token=100.0)
    feeds = {name: np.ones((4, 50), np.int64) for name in real.input_names}
    started = time.perf_counter()
    session.run(feeds, real.output_names[:1])
    assert time.perf_counter() - started >= 4 * 50 * 100e-6
