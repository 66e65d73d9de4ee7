"""The engine process's admission, in one test process: a real `Engine` on a Unix socket and two front
cores (models loaded without sessions, each with its own `EngineLink`), as `serve --workers 2` runs them.

The queue bound is global: the engine refuses a call once the inputs queued from EVERY front reach
max_queue_inputs, while each front alone is within its own bound; a front's own bound refuses what it
holds beyond max_queue_inputs before anything is sent.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bertserve.service.core.core import InferenceCore
from bertserve.service.core.remote_engine import EngineLink
from bertserve.service.engine import model_registry
from bertserve.service.engine.messages import inputs_out
from bertserve.service.engine.process import Engine
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.errors import EngineUnavailable, InferenceFailed, Overloaded, StartupError
from bertserve.service.metrics import Metrics
from bertserve.service.settings import load_settings
from tests.helpers.server import GatedBatches

QUEUE = 3


async def _until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the engine never reached the expected state"
        await asyncio.sleep(0.005)


async def _scenario(settings, address: str) -> dict:
    engine = Engine(settings, address, Metrics())
    await engine.start()
    serving = asyncio.ensure_future(engine.serve())
    cpu = ThreadPoolExecutor(2)
    fronts, links = [], []
    for _ in range(2):
        link = EngineLink(address)
        links.append(link)
        registry = model_registry.load(settings, front=True)
        await link.connect({m.name: m.version for m in registry.ordered})
        fronts.append(InferenceCore(registry, settings, Metrics(), cpu, engine=link))
    model = engine.registry.by_name["tiny-embed"]
    batcher = model.batcher
    outcome: dict = {}
    with GatedBatches(model):
        calls = []
        # fronts 0, 0, 1, 0: one batch cut (computing at the gate; the engine cuts none ahead), then three
        # inputs queued: the engine's queue is full, and front 0's own bound
        for i, front in enumerate([0, 0, 1, 0]):
            calls.append(asyncio.ensure_future(fronts[front].embed("tiny-embed", [f"input {i}"])))
            if i == 0:
                await _until(lambda: len(batcher._running) == 1)
            else:
                await _until(lambda n=i: batcher.depth == n)
        with pytest.raises(Overloaded) as by_engine:  # front 1 holds 1 of its 3: the engine refuses
            await fronts[1].embed("tiny-embed", ["one too many"])
        outcome["engine"] = str(by_engine.value)
        with pytest.raises(Overloaded) as by_front:  # front 0 holds 3 of its 3: refused before sending
            await fronts[0].embed("tiny-embed", ["front full"])
        outcome["front"] = str(by_front.value)
        outcome["queued_after"] = batcher.depth
    outcome["answered"] = [len((await call).vectors) for call in calls]
    engine.stop()
    await serving
    for core, link in zip(fronts, links, strict=True):
        core.shutdown_threads()
        link.close()
    cpu.shutdown()
    return outcome


def test_the_queue_bound_holds_over_every_front(tiny_repo, tmp_path):
    settings = load_settings(
        model_repo=tiny_repo, models=["tiny-embed"], max_queue_inputs=QUEUE, metrics_port=-1, http_port=-1
    )
    outcome = asyncio.run(_scenario(settings, f"{tmp_path}/engine"))
    assert f"the unary queue holds {QUEUE} of max_queue_inputs {QUEUE}" in outcome["engine"]
    assert f"this front holds {QUEUE} of max_queue_inputs {QUEUE}" in outcome["front"]
    assert outcome["queued_after"] == QUEUE  # the refused calls left nothing queued
    assert outcome["answered"] == [1] * 4  # every admitted call is answered once the gate opens


async def _unread_answers(settings, address: str, calls: int) -> int:
    engine = Engine(settings, address, Metrics())
    await engine.start()
    serving = asyncio.ensure_future(engine.serve())
    link = EngineLink(address)
    await link.connect({"tiny-embed": 1})
    link._link.pause_reading()  # the front stops reading (its loop busy): the engine's answers pile up
    core = InferenceCore(model_registry.load(settings, front=True), settings, Metrics(), None, engine=link)
    pending = []
    for i in range(calls):  # a turn each: one message each way per call, as many as there are calls
        pending.append(asyncio.ensure_future(core.embed("tiny-embed", [f"x {i}"])))
        await asyncio.sleep(0)

    def answered() -> bool:  # every input computed and every call answered by the engine
        computed = engine.metrics.registry.get_sample_value(
            "bertserve_batch_size_sum", {"model": "tiny-embed"}
        )
        return computed == calls and engine._calls == {}

    await _until(answered, timeout=120)
    link._link.resume_reading()  # the front reads again
    done, _ = await asyncio.wait(pending, timeout=60)
    engine.stop()
    await serving
    link.close()
    return len(done)


def test_no_answer_is_dropped_when_a_front_reads_late(tiny_repo, tmp_path):
    """Thousands of answers wait for a front that is slow to read (in its connection, not dropped as a
    bounded queue would); none is lost. One input per batch, so answers leave in many frames."""
    calls = 3000
    settings = load_settings(
        model_repo=tiny_repo, models=["tiny-embed"], max_queue_inputs=calls, max_batch_size=1,
        metrics_port=-1, http_port=-1,
    )  # fmt: skip
    assert asyncio.run(_unread_answers(settings, f"{tmp_path}/engine", calls)) == calls


async def _mismatches(tiny_repo, address: str) -> tuple[str, tuple, tuple]:
    settings = load_settings(model_repo=tiny_repo, models=["tiny-embed"], metrics_port=-1, http_port=-1)
    engine = Engine(settings, address, Metrics())
    await engine.start()
    serving = asyncio.ensure_future(engine.serve())
    link = EngineLink(address)
    try:
        with pytest.raises(StartupError) as refused:  # a front that loaded another repository's models
            await link.connect({"tiny-embed": 1, "tiny-classifier": 1})
        answered = asyncio.get_running_loop().create_future()
        ids = np.array([101, 7, 102])
        inputs = inputs_out("no-such-model", [TaskOptions(Task.EMBED)], [ids], [ids * 0], None)
        message = ("submit", "tiny-embed", False, None, inputs)
        link.call(message, lambda results, error: answered.set_result((results, error)))
        results, error = await asyncio.wait_for(answered, 30)  # answered, not left to hang
        streamed = asyncio.get_running_loop().create_future()  # a stream's request: it waits for room first
        link.call(("submit", "tiny-embed", True, None, inputs), lambda *answer: streamed.set_result(answer))
        stream_error = (await asyncio.wait_for(streamed, 30))[1]
        held = engine.registry.by_name["tiny-embed"].batcher._room[True].used  # its room given back
    finally:
        link.close()
        engine.stop()
        await serving
    return str(refused.value), (results, error), (stream_error, held)


def test_the_engine_answers_what_it_cannot_serve(tiny_repo, tmp_path):
    refused, (results, error), (stream_error, held) = asyncio.run(
        _mismatches(tiny_repo, f"{tmp_path}/engine")
    )
    assert "this front loaded" in refused and "restart the server" in refused
    assert results is None and isinstance(error, InferenceFailed) and "no-such-model" in str(error)
    assert isinstance(stream_error, InferenceFailed) and held == 0


async def _before_the_engine_listens(settings, address: str) -> tuple[str, dict, int]:
    """A front's call while its link still waits for the engine (the front listens first)."""
    link = EngineLink(address)
    connecting = asyncio.ensure_future(link.connect({"tiny-embed": 1}))
    core = InferenceCore(model_registry.load(settings, front=True), settings, Metrics(), None, engine=link)
    try:
        await asyncio.sleep(0.2)  # connecting: no engine at `address` yet
        with pytest.raises(EngineUnavailable) as refused:
            await core.embed("tiny-embed", ["too early"])
        held = core.registry.by_name["tiny-embed"].batcher._room[False].used
    finally:
        connecting.cancel()
        link.close()
        core.shutdown_threads()
    return str(refused.value), link._calls, held


def test_a_call_before_the_engine_listens_is_refused_as_unavailable(tiny_repo, tmp_path):
    settings = load_settings(model_repo=tiny_repo, models=["tiny-embed"], metrics_port=-1, http_port=-1)
    message, calls, held = asyncio.run(_before_the_engine_listens(settings, f"{tmp_path}/engine"))
    assert "still loading" in message and calls == {} and held == 0  # nothing left registered or held
