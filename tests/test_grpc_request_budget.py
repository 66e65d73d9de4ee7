"""gRPC request messages held by unary calls in flight are bounded by `max_request_bytes_in_flight`: a call
whose message would pass it is refused at once with RESOURCE_EXHAUSTED naming the setting, counted, and
the bytes come back when the calls holding them end."""

from __future__ import annotations

import grpc
import pytest

from bertserve.client import Client
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.server import GatedBatches, ServerThread, metric, scrape, wait_for

BUDGET = 200_000
LARGE = pb.EmbedRequest(inputs=["word " * 400] * 60, truncate=True)  # about 120 KB: one fits, two do not


@pytest.fixture(scope="module")
def server(tiny_repo):
    with ServerThread(
        model_repo=tiny_repo, models=["tiny-embed"], max_request_bytes_in_flight=BUDGET
    ) as running:
        yield running


def test_a_request_past_the_bytes_in_flight_is_refused_and_the_bytes_come_back(server):
    assert BUDGET // 2 < LARGE.ByteSize() < BUDGET
    before = scrape(server.metrics_url)
    with GatedBatches(server.server.models[0]) as gate, Client(server.address) as client:
        busy = client.stub.Embed.future(pb.EmbedRequest(inputs=["a"]), timeout=60)
        assert gate.computing.wait(30)
        held = client.stub.Embed.future(LARGE, timeout=60)  # admitted, then queued behind the gate
        wait_for(lambda: server.server.admission.request_bytes > LARGE.ByteSize())
        with pytest.raises(grpc.RpcError) as refused:
            client.stub.Embed(LARGE, timeout=60)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"max_request_bytes_in_flight {BUDGET}" in refused.value.details()
        gate.release()
        assert len(busy.result().embeddings) == 1 and len(held.result().embeddings) == 60
        wait_for(lambda: server.server.admission.request_bytes == 0)
        assert len(client.stub.Embed(LARGE, timeout=60).embeddings) == 60  # the bytes came back
    after = scrape(server.metrics_url)
    exhausted = metric(after, "bertserve_requests_total", rpc="Embed", code="RESOURCE_EXHAUSTED") - metric(
        before, "bertserve_requests_total", rpc="Embed", code="RESOURCE_EXHAUSTED"
    )
    assert exhausted == 1
