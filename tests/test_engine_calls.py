"""A call's inputs and results as one unit (service/engine/unary_calls.py, service/engine/messages.py,
service/core/remote_engine.py): what crosses the engine link comes back equal, rows keep their order, and
a call ends exactly once, whether answered, failed or cancelled."""

from __future__ import annotations

import asyncio
import threading
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bertserve.service.core.remote_engine import RemoteCall
from bertserve.service.engine.batch_items import ItemResult
from bertserve.service.engine.batcher import Batcher, BatchLimits
from bertserve.service.engine.messages import (
    IN_BAND_BYTES,
    inputs_in,
    inputs_out,
    pack,
    results_in,
    results_out,
    unpack,
)
from bertserve.service.engine.process import Engine
from bertserve.service.engine.queue_room import LaneRoom
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.engine.unary_calls import CallInputs, submit_call
from bertserve.service.errors import InferenceFailed

EMBED = TaskOptions(Task.EMBED, normalize=True)
FILL = TaskOptions(Task.FILL_MASK, top_k=3)


def _through_link(message: object) -> object:
    return unpack(pack(message))


def _rows(lengths: list[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 30_000, size=n, dtype=np.int64) for n in lengths]


@pytest.mark.parametrize(
    "lengths",
    [[7], [3, 12, 1, 40], [512] * 200],  # one input; uneven ones; a call whose ids travel out of band
)
def test_a_calls_inputs_come_back_input_by_input(lengths):
    ids = _rows(lengths)
    type_ids = [np.zeros(n, np.int64) for n in lengths]
    type_ids[-1][n // 2 :] = 1 if (n := lengths[-1]) > 1 else 0  # one sentence pair among single texts
    masks = [np.array([k % n], np.int64) for k, n in enumerate(lengths)]
    message = inputs_out("m", [EMBED, FILL], ids, type_ids, masks)
    assert (message[3] is None) == (len(lengths) == 1)  # one input: no lengths, nothing to split
    assert len(pack(message)) == (3 if sum(lengths) * 8 >= IN_BAND_BYTES else 1)  # ids and type ids apart
    call = inputs_in(_through_link(message), {"m": "model m"}, 2.5, True)
    assert (call.model, call.options, call.deadline, call.bulk) == ("model m", [EMBED, FILL], 2.5, True)
    ids_back, types_back, masks_back = call.ids, call.type_ids, call.masks
    for sent, back in ((ids, ids_back), (type_ids, types_back), (masks, masks_back)):
        assert [a.tolist() for a in back] == [a.tolist() for a in sent]
        assert all(a.dtype == np.int64 for a in back)
    if len(lengths) == 1:  # in band: views of the message's bytes
        assert not ids_back[0].flags.writeable and not types_back[0].flags.writeable


def test_single_texts_type_ids_travel_as_none_and_masks_only_when_asked():
    ids = _rows([4, 9])
    message = inputs_out("m", [EMBED], ids, [np.zeros(4, np.int64), np.zeros(9, np.int64)], None)
    assert message[4] is None and message[5] is None
    call = inputs_in(_through_link(message), {"m": None}, None, False)
    assert [t.tolist() for t in call.type_ids] == [[0] * 4, [0] * 9] and call.masks is None
    with pytest.raises(KeyError):  # a model the engine lacks
        inputs_in(message, {}, None, False)


def test_results_of_one_shape_travel_stacked_and_others_one_by_one():
    vectors = [ItemResult(np.full(384, k, np.float32), 0.001 * k, 0.002, 7 + k % 2) for k in range(32)]
    packed = results_out(vectors)
    assert not isinstance(packed[0], list)  # one array for the call
    back = results_in(_through_link(packed))
    assert [r.value.tolist() for r in back] == [r.value.tolist() for r in vectors]
    assert [r[1:] for r in back] == [r[1:] for r in vectors]
    mixed = [ItemResult(np.zeros(3, np.float32), 0.1, 0.2, 1), ItemResult((np.ones(2), [5]), 0.1, 0.2, 1)]
    mixed += [ItemResult(np.zeros(4, np.float32), 0.1, 0.2, 2)]
    packed = results_out(mixed)
    assert isinstance(packed[0], list)
    back = results_in(_through_link(packed))
    assert back[0].value.shape == (3,) and back[1].value[1] == [5] and back[2].value.shape == (4,)


def test_rows_are_queued_task_by_task_with_masks_for_fill_mask_alone():
    ids, types = _rows([2, 3, 4]), [np.zeros(n, np.int64) for n in (2, 3, 4)]
    masks = [np.array([1]), np.array([2]), np.array([0, 3])]
    inputs = CallInputs("model", ids, types, [EMBED, FILL], 5.0, True, masks)
    work = inputs.work(list(range(inputs.rows)), origin="front")
    assert inputs.rows == 6 and [w.future for w in work] == list(range(6))
    assert [(w.options, w.length) for w in work] == [(o, n) for o in (EMBED, FILL) for n in (2, 3, 4)]
    assert [w.mask_positions for w in work[:3]] == [None] * 3
    assert [w.mask_positions.tolist() for w in work[3:]] == [[1], [2], [0, 3]]
    assert {(w.model, w.deadline, w.bulk, w.origin, w.enqueued_at) for w in work} == {
        ("model", 5.0, True, "front", work[0].enqueued_at)
    }


async def _through_a_batcher(fail: bool, cancel: bool) -> tuple[list, int, int]:
    """(what `on_end` heard, inputs computed, inputs queued at the end) for one 6-input call on a batcher
    of batches of 2, whose first batch waits for a gate."""
    gate, computed = threading.Event(), []

    def compute(batch):
        gate.wait(5)
        computed.extend(item.ids[0] for item in batch)
        if fail:
            raise InferenceFailed("boom")
        return [int(item.ids[0]) * 10 for item in batch]

    limits = BatchLimits(max_batch_size=2, max_batch_tokens=100, max_queue_delay_s=0, max_queue_inputs=100)
    ends: list = []
    with ThreadPoolExecutor(1) as pool:
        batcher = Batcher("m", compute, limits, pool, prefetch=0)
        batcher.start()
        ids = [np.array([k], np.int64) for k in range(6)]
        inputs = CallInputs(None, ids, [np.zeros(1, np.int64)] * 6, [EMBED])
        call = batcher.submit_call(inputs, lambda results, error: ends.append((results, error)))
        while not batcher._running:
            await asyncio.sleep(0.001)
        if cancel:
            call.cancel()
            call.cancel()  # a second cancel changes nothing
        gate.set()
        for _ in range(500):
            if ends and batcher.depth == 0 and not batcher._running:
                break
            await asyncio.sleep(0.01)
        await batcher.close()
        return ends, len(computed), batcher.depth


def test_a_call_ends_once_with_every_result_in_order():
    ends, computed, queued = asyncio.run(_through_a_batcher(fail=False, cancel=False))
    assert computed == 6 and queued == 0 and len(ends) == 1
    results, error = ends[0]
    assert error is None and [r.value for r in results] == [0, 10, 20, 30, 40, 50]


def test_a_failed_call_ends_once_and_its_other_inputs_are_dropped():
    ends, computed, queued = asyncio.run(_through_a_batcher(fail=True, cancel=False))
    assert len(ends) == 1 and ends[0][0] is None and isinstance(ends[0][1], InferenceFailed)
    assert computed == 2 and queued == 0  # the first batch failed: the rest was never computed


def test_a_cancelled_call_ends_once_and_its_queued_inputs_are_dropped():
    ends, computed, queued = asyncio.run(_through_a_batcher(fail=False, cancel=True))
    assert ends == [(None, None)] and computed == 2 and queued == 0  # only the batch already computing


class _Link:
    def __init__(self):
        self.cancels: list = []

    def cancel(self, call, then):
        self.cancels.append((call, then))


def test_a_remote_call_ends_once_and_frees_its_room_only_when_the_engine_answers():
    room, link, ends = LaneRoom(10), _Link(), []
    held = room.take(4)
    remote = RemoteCall(link, lambda results, error: ends.append((results, error)), held)
    remote.id = 9
    remote.cancel()
    remote.cancel()
    assert ends == [(None, None)] and len(link.cancels) == 1 and room.used == 4  # the engine holds them
    link.cancels[0][1]()  # the engine's word that it dropped them
    remote.answer(results_out([ItemResult(np.zeros(2), 0.0, 0.0, 1)]), None)  # a late answer: dropped
    assert ends == [(None, None)] and room.used == 0
    answered = RemoteCall(link, lambda results, error: ends.append((results, error)), room.take(1))
    answered.answer(results_out([ItemResult(np.ones(2), 0.5, 0.25, 3)]), None)
    answered.cancel()  # after the answer: nothing
    (result,), error = ends[1]
    assert error is None and result.value.tolist() == [1.0, 1.0] and result[1:] == (0.5, 0.25, 3)
    assert len(ends) == 2 and len(link.cancels) == 1 and room.used == 0


def test_a_call_of_no_rows_ends_at_once():
    ends: list = []
    batcher = types.SimpleNamespace(submit=None, note_dead=lambda: None)  # never asked to queue anything
    no_tasks = CallInputs(None, [np.zeros(1, np.int64)], [np.zeros(1, np.int64)], [])
    call = submit_call(batcher, no_tasks, lambda results, error: ends.append((results, error)))
    assert ends == [([], None)] and call.ended
    assert results_in(_through_link(results_out([]))) == []


def test_the_engine_answers_a_call_of_no_rows():
    sent: list = []

    class Front:  # hashable, as a link is
        post = sent.append

    front = Front()
    engine = Engine.__new__(Engine)  # its message handling alone: no models loaded
    engine._calls = {}
    engine._groups = {
        "enc": types.SimpleNamespace(batcher=types.SimpleNamespace(submit=None, note_dead=None))
    }
    engine.registry = types.SimpleNamespace(by_name={"m": None})
    no_tasks = inputs_out("m", [], [np.zeros(3, np.int64)], [np.zeros(3, np.int64)], None)
    engine._handle(front, ("submit", 7, "enc", False, None, no_tasks))
    assert [(m[0], m[1], results_in(m[2])) for m in sent] == [("done", 7, [])] and not engine._calls


async def _two_calls_one_raising() -> list:
    """Two one-input calls in one batch; the first's `on_end` raises."""
    limits = BatchLimits(max_batch_size=2, max_batch_tokens=100, max_queue_delay_s=0.05, max_queue_inputs=100)
    ends: list = []

    def raising(results, error):
        raise RuntimeError("a broken caller")

    with ThreadPoolExecutor(1) as pool:
        batcher = Batcher("m", lambda batch: [1] * len(batch), limits, pool, prefetch=0)
        batcher.start()
        one = [np.array([1], np.int64)], [np.zeros(1, np.int64)], [EMBED]
        batcher.submit_call(CallInputs(None, *one), raising)
        batcher.submit_call(CallInputs(None, *one), lambda results, error: ends.append((results, error)))
        for _ in range(500):
            if ends:
                break
            await asyncio.sleep(0.01)
        await batcher.close()
    return ends


def test_a_calls_end_that_raises_leaves_its_batch_mates_answered():
    ((results, error),) = asyncio.run(_two_calls_one_raising())
    assert error is None and [r.value for r in results] == [1]
