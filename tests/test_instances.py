"""Model instances on a real server: every instance is warmed up before the server reports serving, and
calls computed on several instances at once answer as one instance does."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bertserve.client import Client
from bertserve.service.runtime import GraphSession
from tests.helpers.server import ServerThread

TEXTS = [f"instance test number {i} " + "word " * (i % 7) for i in range(48)]


def test_every_instance_is_warmed_up_and_instances_answer_alike(tiny_repo, tiny_server, monkeypatch):
    ran: list[int] = []  # id() of the session of each encoder run
    lock = threading.Lock()
    real_run = GraphSession.run

    def recording_run(self, feeds, outputs):
        with lock:
            ran.append(id(self))
        return real_run(self, feeds, outputs)

    monkeypatch.setattr(GraphSession, "run", recording_run)
    with ServerThread(
        model_repo=tiny_repo, models=["tiny-embed"], instances=2, max_queue_delay_ms=5
    ) as server:
        (encoder,) = server.server.core.encoders
        instances = {id(s) for s in encoder.sessions}
        assert len(instances) == 2
        assert instances <= set(ran)  # warmed up: the first real call on either instance is not a cold one
        ran.clear()
        client = Client(server.address, timeout=30)
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda t: client.embed([t], model="tiny-embed").vectors[0], TEXTS))
        assert set(ran) == instances  # both computed
    reference = Client(tiny_server.address, timeout=30).embed(TEXTS, model="tiny-embed").vectors
    np.testing.assert_allclose(np.array(answers), np.array(reference), atol=1e-5)
