"""A call whose deadline is too short for the queue ahead of it is refused at once with DEADLINE_EXCEEDED
and never reaches the model, through a live server. (Calls that expire while queued, or that their client
cancels, are covered by tests/test_server_deadlines.py; the batcher's estimate by tests/test_batcher.py.)

The model is made slow and held by a test wrapper around the batcher's compute function (as the other
deadline tests do), so the queue ahead is long and the server's wait estimate is large and known.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from bertserve.client import Client
from bertserve.service.engine.batcher import PREFETCH_BATCHES
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.server import ServerThread, metric, scrape

SECONDS_PER_BATCH = 0.2


def test_a_deadline_shorter_than_the_queue_is_refused_at_once(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], max_batch_size=1) as server:
        batcher = server.server.models[0].batcher
        real_compute = batcher.runs.compute
        release = threading.Event()
        release.set()
        seen: list[int] = []

        def slow(batch):
            assert release.wait(60)
            time.sleep(SECONDS_PER_BATCH)
            seen.extend(len(item.ids) for item in batch)
            return real_compute(batch)

        batcher.runs.compute = slow
        long_text = " ".join(["cat"] * 60)  # 62 tokens
        with Client(server.address, timeout=60) as client:
            client.embed(["a cat"])  # the batcher learns the model's time per token (about 0.2 s / 4 tokens)
            release.clear()
            queued = [
                client.stub.Embed.future(pb.EmbedRequest(inputs=[long_text]), timeout=120) for _ in range(6)
            ]
            deadline = time.monotonic() + 10
            # one computing (held), PREFETCH_BATCHES cut ahead, the rest queued: about 250 tokens ahead
            while batcher.depth < len(queued) - 1 - PREFETCH_BATCHES:
                assert time.monotonic() < deadline, "the calls never queued"
                time.sleep(0.01)
            assert batcher.estimated_wait_s(4) > 10
            before = scrape(server.metrics_url)
            started = time.perf_counter()
            with pytest.raises(grpc.RpcError) as refused:
                client.embed(["a dog"], timeout=5.0)
            refused_after = time.perf_counter() - started
            assert refused.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert "the queue ahead needs about" in refused.value.details()
            # at once, not when the deadline passed (the rest of the bound is slack for a loaded machine)
            assert refused_after < 2.5
            patient = client.stub.Embed.future(pb.EmbedRequest(inputs=["a dog"]), timeout=120)
            release.set()
            assert all(len(call.result().embeddings) == 1 for call in [*queued, patient])
        after = scrape(server.metrics_url)
    assert seen.count(4) == 2  # the first "a cat" and the patient "a dog"; the refused "a dog" never ran
    assert seen.count(62) == 6
    moved = metric(after, "bertserve_requests_total", code="DEADLINE_EXCEEDED") - metric(
        before, "bertserve_requests_total", code="DEADLINE_EXCEEDED"
    )
    assert moved == 1
