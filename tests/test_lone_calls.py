"""Single-input calls in the engine (service/engine/lone_calls.py): queued with no callback, answered
together per turn in one `rows` message (messages.rows_out) over a real link, and exactly once whether
answered, failed, refused, expired or cancelled; the front reads each call's row as its answer."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bertserve.service.core.remote_engine import EngineLink, RemoteBatcher
from bertserve.service.engine.batch_items import ItemResult
from bertserve.service.engine.batcher import Batcher, BatchLimits
from bertserve.service.engine.frame_link import FrameLink
from bertserve.service.engine.lone_calls import LoneCall
from bertserve.service.engine.messages import (
    lones_in,
    lones_out,
    pack,
    results_in,
    rows_in,
    rows_out,
    unpack,
)
from bertserve.service.engine.process import Engine
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.engine.unary_calls import CallInputs
from tests.helpers.links import linked, none_failed, until

EMBED = TaskOptions(Task.EMBED, normalize=True)
LIMITS = BatchLimits(max_batch_size=3, max_batch_tokens=100, max_queue_delay_s=0.01, max_queue_inputs=8)


def test_rows_travel_stacked_or_one_by_one_and_come_back_call_by_call():
    same = [
        (7, ItemResult(np.full(4, 1.0, np.float32), 0.1, 0.2, 3)),
        (9, ItemResult(np.zeros(4, np.float32), 0.3, 0.2, 3)),
    ]
    message = unpack(pack(rows_out(same)))
    assert message[0] == "rows" and isinstance(message[2], tuple)  # one stacked array (as `small`)
    back = [(call, results_in(result)) for call, result in rows_in(message)]
    assert [call for call, _ in back] == [7, 9]
    for (_, sent), (_, (got,)) in zip(same, back, strict=True):
        assert np.array_equal(got.value, sent.value) and got[1:] == sent[1:]
    mixed = [(1, ItemResult(np.ones(3, np.float32), 0.0, 0.1, 1)), (2, ItemResult([("a", 0.5)], 0.0, 0.1, 1))]
    back = [(call, results_in(result)) for call, result in rows_in(unpack(pack(rows_out(mixed))))]
    assert np.array_equal(back[0][1][0].value, np.ones(3)) and back[1][1][0].value == [("a", 0.5)]


def _lone(call: int, ids: np.ndarray, deadline: float | None) -> tuple:
    """A `lones` message of one call, as it arrives from a front."""
    return unpack(pack(lones_out([(call, "enc", "m", EMBED, ids, np.zeros_like(ids), None, deadline)])))


async def _engine_scenario(mode: str) -> tuple[list, list, int]:
    """Three single-input calls from one front into a real batcher of batches of 3 (an engine with no
    models loaded). (the messages the front got, the ids computed, the calls the engine still holds)."""
    gate, computed = threading.Event(), []

    def compute(batch):
        gate.wait(5)
        computed.extend(int(item.ids[0]) for item in batch)
        if mode == "fail":
            raise RuntimeError("boom")
        return [np.full(2, int(item.ids[0]), np.float32) for item in batch]

    limits = BatchLimits(max_batch_size=3, max_batch_tokens=100, max_queue_delay_s=0.05, max_queue_inputs=4)
    link, received = await linked()
    with ThreadPoolExecutor(1) as pool:
        batcher = Batcher("m", compute, limits, pool, prefetch=0)
        batcher.start()
        engine = Engine.__new__(Engine)  # its message handling alone
        engine._calls = {}
        engine._groups = {"enc": types.SimpleNamespace(batcher=batcher)}
        engine.registry = types.SimpleNamespace(by_name={"m": None})
        deadline = time.monotonic() + 60
        if mode == "expire":  # call 0 computes (at the gate) while 1-3 wait past their deadline
            engine._handle(link, _lone(0, np.array([0], np.int64), None))
            await until(lambda: batcher._running)
            deadline = time.monotonic() + 0.05
        for k in (1, 2, 3):
            engine._handle(link, _lone(k, np.array([k, 0], np.int64), deadline))
        if mode == "cancel":
            engine._handle(link, ("cancel", 2))
            engine._handle(link, ("cancel", 2))  # a second cancel changes nothing
        if mode == "refuse":  # room for 4: the fifth is refused, the fourth queued
            for k in (4, 5):
                engine._handle(link, _lone(k, np.array([k], np.int64), None))
        if mode == "expire":
            await asyncio.sleep(0.2)
        gate.set()
        answered = {"refuse": 5, "expire": 4}.get(mode, 3)
        await until(lambda: sum(len(m[1]) if m[0] == "rows" else 1 for m in received) == answered)
        await asyncio.sleep(0.05)  # nothing more comes
        await batcher.close()
    link.close()
    return received, computed, len(engine._calls)


def test_single_input_calls_answered_in_one_turn_share_one_rows_message():
    received, computed, held = asyncio.run(_engine_scenario("answer"))
    ((kind, calls, *_),) = received  # one batch, one turn, one message
    assert kind == "rows" and calls == (1, 2, 3) and computed == [1, 2, 3] and held == 0
    answers = {call: results_in(result)[0].value.tolist() for call, result in rows_in(received[0])}
    assert answers == {1: [1.0, 1.0], 2: [2.0, 2.0], 3: [3.0, 3.0]}


def test_a_failed_batch_answers_each_of_its_calls_once_with_its_error():
    received, _, held = asyncio.run(_engine_scenario("fail"))
    assert sorted(m[:3] for m in received) == [("error", k, "InferenceFailed") for k in (1, 2, 3)]
    assert held == 0


def test_a_cancelled_call_is_answered_cancelled_once_and_never_computed():
    received, computed, held = asyncio.run(_engine_scenario("cancel"))
    assert ("cancelled", 2) in received and 2 not in computed and held == 0
    rows = [m for m in received if m[0] == "rows"]
    assert sorted(c for m in rows for c in m[1]) == [1, 3] and len(received) == len(rows) + 1


def test_a_call_refused_for_room_is_answered_at_once_and_not_held():
    received, computed, held = asyncio.run(_engine_scenario("refuse"))
    errors = [m for m in received if m[0] == "error"]
    assert [(m[1], m[2]) for m in errors] == [(5, "Overloaded")] and "max_queue_inputs 4" in errors[0][3]
    assert sorted(computed) == [1, 2, 3, 4] and held == 0


def test_calls_whose_deadline_passed_in_the_queue_are_answered_with_it():
    received, computed, held = asyncio.run(_engine_scenario("expire"))
    errors = sorted((m[0], m[1], m[2]) for m in received if m[0] != "rows")
    assert errors == [("error", k, "DeadlineTooShort") for k in (1, 2, 3)]
    assert [m[1] for m in received if m[0] == "rows"] == [(0,)] and computed == [0] and held == 0


def test_a_front_answers_each_call_of_a_rows_message_once():
    link = EngineLink("unused")
    heard: list = []
    for call in (4, 5):
        link._calls[call] = lambda results, error, call=call: heard.append((call, results, error))
    values = [ItemResult(np.full(2, k, np.float32), 0.0, 0.1, 1) for k in (4, 5, 6)]
    link._received(None, unpack(pack(rows_out(list(zip((4, 5, 6), values, strict=True))))))
    assert [(call, results_in(results)[0].value.tolist(), error) for call, results, error in heard] == [
        (4, [4.0, 4.0], None),
        (5, [5.0, 5.0], None),
    ]  # call 6 is not this front's (cancelled and answered already): ignored
    assert link._calls == {}


def test_a_turns_single_input_calls_travel_field_by_field_and_come_back_whole():
    ids = [np.array([5, 6, 7], np.int64), np.array([9], np.int64), np.arange(40, dtype=np.int64)]
    types = [np.zeros(3, np.int64), np.zeros(1, np.int64), np.ones(40, np.int64)]
    masks = [None, np.array([0], np.int64), None]  # a fill-mask call's mask positions
    calls = [(k, "enc", "m", EMBED, ids[k], types[k], masks[k], 1.5 + k) for k in range(3)]
    back = list(lones_in(unpack(pack(lones_out(calls)))))
    for sent, got in zip(calls, back, strict=True):
        assert got[:4] == sent[:4] and got[7] == sent[7]
        assert np.array_equal(got[4], sent[4]) and np.array_equal(got[5], sent[5])
    assert back[0][6] is None and back[1][6].tolist() == [0] and back[2][6] is None
    only_zeros = lones_out(calls[:2])
    assert only_zeros[7] is None  # all type ids 0: none travel
    assert lones_out(calls[:1])[8] is None  # no call with mask positions: none travel
    (one,) = lones_in(unpack(pack(lones_out(calls[1:2]))))
    assert one[4].tolist() == [9] and one[5].tolist() == [0]


def test_one_bad_call_in_a_lones_message_is_answered_alone_and_the_rest_computed():
    async def scenario():
        link, received = await linked()
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(
                "m", lambda batch: [np.zeros(2, np.float32)] * len(batch), LIMITS, pool, prefetch=0
            )
            batcher.start()
            engine = Engine.__new__(Engine)
            engine._calls = {}
            engine._groups = {"enc": types.SimpleNamespace(batcher=batcher)}
            engine.registry = types.SimpleNamespace(by_name={"m": None})
            calls = [
                (
                    k,
                    "enc",
                    "m" if k != 2 else "unknown",
                    EMBED,
                    np.array([k], np.int64),
                    np.zeros(1, np.int64),
                    None,
                    None,
                )
                for k in (1, 2, 3)
            ]
            engine._handle(link, unpack(pack(lones_out(calls))))
            await until(lambda: sum(len(m[1]) if m[0] == "rows" else 1 for m in received) == 3)
            await batcher.close()
        link.close()
        return received, engine._calls

    received, held = asyncio.run(scenario())
    errors = [m[:3] for m in received if m[0] == "error"]
    assert errors == [("error", 2, "InferenceFailed")] and held == {}
    assert sorted(c for m in received if m[0] == "rows" for c in m[1]) == [1, 3]


def test_a_fronts_single_input_calls_of_one_turn_leave_in_one_lones_message():
    sent: list = []

    class Link:  # the FrameLink's two ways out
        def post(self, message):
            sent.append(message)

        def gather(self, build, item, failed):
            assert failed == link._lones_failed  # what fails the call here should its message not build
            sent.append(("gathered", build, item))

    link = EngineLink("unused")
    link._link, link._hello = Link(), types.SimpleNamespace(done=lambda: True)
    remote = RemoteBatcher(link, "enc", LIMITS)
    model = types.SimpleNamespace(name="m")
    one = CallInputs(model, [np.array([1, 2], np.int64)], [np.zeros(2, np.int64)], [EMBED], deadline=3.0)
    two = CallInputs(model, [np.array([1], np.int64)] * 2, [np.zeros(1, np.int64)] * 2, [EMBED])
    for inputs in (one, one, two):
        remote.submit_call(inputs, lambda results, error: None, remote.reserve(inputs.rows))
    gathered = [m for m in sent if m[0] == "gathered"]
    assert [m[1] for m in gathered] == [lones_out] * 2 and [m[2][0] for m in gathered] == [1, 2]
    assert [m[0] for m in sent if m[0] != "gathered"] == ["submit"]  # two inputs: a call of its own
    assert gathered[0][2][1:4] == ("enc", "m", EMBED) and gathered[0][2][6:] == (None, 3.0)


async def _engine_link(compute, pool) -> tuple[FrameLink, list, Batcher, Engine]:
    """A front's link to an engine (no models loaded) over a real socket pair, the engine's one batcher
    computing with `compute` on `pool`: (the front's link, what the front received, the batcher, the engine)."""
    loop = asyncio.get_running_loop()
    batcher = Batcher("m", compute, LIMITS, pool, prefetch=0)
    batcher.start()
    engine = Engine.__new__(Engine)
    engine._calls = {}
    engine._groups = {"enc": types.SimpleNamespace(batcher=batcher)}
    engine.registry = types.SimpleNamespace(by_name={"m": None})
    ours, theirs = socket.socketpair()
    await loop.create_unix_connection(lambda: FrameLink(engine._handle, lambda e: None), sock=theirs)
    received: list = []
    _, front = await loop.create_unix_connection(
        lambda: FrameLink(lambda _, m: received.append(m), lambda e: None), sock=ours
    )
    return front, received, batcher, engine


def test_a_call_cancelled_in_the_turn_it_was_sent_is_never_computed():
    """The front's cancel leaves after the gathered call it cancels, so the engine drops it."""
    computed: list = []

    def compute(batch):
        computed.extend(int(item.ids[0]) for item in batch)
        return [np.zeros(2, np.float32)] * len(batch)

    async def scenario():
        with ThreadPoolExecutor(1) as pool:
            return await _cancelled_in_turn(pool)

    async def _cancelled_in_turn(pool):
        front, received, batcher, engine = await _engine_link(compute, pool)
        one = (7, "enc", "m", EMBED, np.array([7], np.int64), np.zeros(1, np.int64), None, None)
        front.gather(lones_out, one, none_failed)
        front.post(("cancel", 7))  # the same turn
        await until(lambda: received)
        await asyncio.sleep(0.05)
        await batcher.close()
        front.close()
        return received, engine._calls

    received, held = asyncio.run(scenario())
    assert received == [("cancelled", 7)] and computed == [] and held == {}


def test_a_lones_message_that_cannot_be_read_answers_every_call_it_did_not_queue():
    async def scenario():
        with ThreadPoolExecutor(1) as pool:
            return await _unreadable(pool)

    async def _unreadable(pool):
        front, received, batcher, engine = await _engine_link(
            lambda batch: [np.zeros(2, np.float32)] * len(batch), pool
        )
        calls = [
            (k, "enc", "m", EMBED, np.array([k], np.int64), np.zeros(1, np.int64), None, None)
            for k in (1, 2, 3)
        ]
        message = list(lones_out(calls))
        message[4] = (message[4][0], ("no such task",), message[4][2])  # call 2's options unreadable
        front.post(tuple(message))
        await until(lambda: sum(len(m[1]) if m[0] == "rows" else 1 for m in received) == 3)
        await asyncio.sleep(0.05)
        await batcher.close()
        front.close()
        return received, engine._calls

    received, held = asyncio.run(scenario())
    assert sorted(m[:3] for m in received if m[0] == "error") == [
        ("error", 2, "InferenceFailed"),
        ("error", 3, "InferenceFailed"),
    ]
    assert [m[1] for m in received if m[0] == "rows"] == [(1,)] and held == {}


def test_a_front_fails_the_calls_of_a_lones_message_it_cannot_build():
    link = EngineLink("unused")
    heard: list = []
    for call in (1, 2):
        link._calls[call] = lambda results, error, call=call: heard.append(
            (call, results, type(error).__name__)
        )
    link._lones_failed([(1, "enc"), (2, "enc")], ValueError("no"))
    assert heard == [(1, None, "InferenceFailed"), (2, None, "InferenceFailed")] and link._calls == {}


def test_rows_that_cannot_be_built_are_answered_one_by_one_with_the_error():
    sent: list = []
    front = types.SimpleNamespace(post=sent.append)
    lone = LoneCall({}, front, 5, None)
    lone._rows_failed([(5, None), (6, None)], ValueError("no"))
    assert [m[:3] for m in sent] == [("error", 5, "InferenceFailed"), ("error", 6, "InferenceFailed")]
