"""Inputs whose deadline passes while queued, or whose caller cancels, never reach the model and are
counted; a full queue answers RESOURCE_EXHAUSTED at once."""

from __future__ import annotations

import threading

import grpc
import pytest

from bertserve.client import Client
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.server import ServerThread, metric, scrape, wait_for


@pytest.fixture
def gated_server(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], max_queue_inputs=4) as server:
        model = server.server.models[0]
        state = {"computing": threading.Event(), "release": threading.Event(), "seen": []}
        real_compute = model.batcher.runs.compute

        def gated(batch):
            state["computing"].set()
            assert state["release"].wait(30)
            state["seen"].extend(len(item.ids) for item in batch)
            return real_compute(batch)

        model.batcher.runs.compute = gated
        yield server, state
        state["release"].set()


def test_expired_and_cancelled_inputs_skip_the_model(gated_server):
    server, state = gated_server
    before = scrape(server.metrics_url)
    with Client(server.address) as client:
        busy = client.stub.Embed.future(pb.EmbedRequest(inputs=["a"]), timeout=30)  # 3 tokens
        assert state["computing"].wait(30)
        # cut ahead (PREFETCH_BATCHES): it waits for the instance in the executor, and expires there
        # 4 tokens; a deadline long enough to be cut ahead first on a loaded machine, short enough to expire
        # while held
        expiring = client.stub.Embed.future(pb.EmbedRequest(inputs=["a cat"]), timeout=3.0)
        wait_for(lambda: len(server.server.models[0].batcher._running) == 2)
        cancelled = client.stub.Embed.future(pb.EmbedRequest(inputs=["a cat sat"]), timeout=30)  # 5 tokens
        wait_for(lambda: metric(scrape(server.metrics_url), "bertserve_queue_depth", model="tiny-embed") == 1)
        with pytest.raises(grpc.RpcError) as full:  # 1 computing, 1 cut ahead, 1 queued; 4 more exceed 4
            client.embed(["x", "y", "z", "w"], timeout=5)
        assert full.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_queue_inputs 4" in full.value.details()
        with pytest.raises(grpc.RpcError) as expired:
            expiring.result()
        assert expired.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        cancelled.cancel()
        wait_for(
            lambda: metric(scrape(server.metrics_url), "bertserve_requests_total", code="CANCELLED") == 1
        )
        state["release"].set()
        assert len(busy.result().embeddings) == 1
        assert len(client.embed(["a cat sat on"]).vectors) == 1  # the server carries on
    assert state["seen"] == [3, 6]  # only the busy call and the last one reached the model (the batch cut
    # ahead was skipped in the worker: its only input had expired)
    after = scrape(server.metrics_url)

    def moved(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert moved("bertserve_dropped_total", model="tiny-embed", reason="deadline") == 1
    assert moved("bertserve_dropped_total", model="tiny-embed", reason="cancelled") == 1
    assert moved("bertserve_requests_total", rpc="Embed", code="RESOURCE_EXHAUSTED") == 1
