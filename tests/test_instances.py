"""Model instances on a real server: every instance is warmed up before the server reports serving,
instances compute at the same time (on CPU, by default, as concurrent runs of one shared session), and
calls computed on several instances at once answer as one instance does."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bertserve.client import Client
from bertserve.service.engine.runtime import GraphSession
from tests.helpers.server import ServerThread

TEXTS = [f"instance test number {i} " + "word " * (i % 7) for i in range(48)]
RUN_HOLD_S = 0.02  # each encoder run is held this long, so batches handed to two instances overlap


@pytest.mark.parametrize("mode, distinct_sessions", [("auto", 1), ("shared", 1), ("separate", 2)])
def test_instances_warm_up_compute_at_once_and_answer_alike(
    tiny_repo, tiny_server, monkeypatch, mode, distinct_sessions
):
    ran: list[int] = []  # id() of the session of each encoder run
    running, most_at_once = [0], [0]
    lock = threading.Lock()
    real_run = GraphSession.run

    def recording_run(self, feeds, outputs, captured=False):
        with lock:
            ran.append(id(self))
            running[0] += 1
            most_at_once[0] = max(most_at_once[0], running[0])
        try:
            time.sleep(RUN_HOLD_S)
            return real_run(self, feeds, outputs, captured)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(GraphSession, "run", recording_run)
    with ServerThread(
        model_repo=tiny_repo,
        models=["tiny-embed"],
        instances=2,
        instance_sessions=mode,
        max_queue_delay_ms=5,
    ) as server:
        (encoder,) = server.server.core.encoders
        assert encoder.instances == 2
        sessions = {id(s) for s in encoder.sessions}
        assert len(sessions) == distinct_sessions  # on CPU, auto shares one session
        assert ran.count(id(encoder.sessions[0])) >= 2 // distinct_sessions  # each instance warmed up
        assert sessions <= set(ran)
        ran.clear()
        most_at_once[0] = 0
        client = Client(server.address, timeout=30)
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda t: client.embed([t], model="tiny-embed").vectors[0], TEXTS))
        assert set(ran) == sessions  # every session computed
        assert most_at_once[0] == 2  # two batches at once, never more than the instances
    reference = Client(tiny_server.address, timeout=30).embed(TEXTS, model="tiny-embed").vectors
    np.testing.assert_allclose(np.array(answers), np.array(reference), atol=1e-5)
