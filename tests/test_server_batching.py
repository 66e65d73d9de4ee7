"""Concurrent callers share batches and get the same answers as one batched call; /metrics shows it."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from bertserve.client import Client
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.server import metric, scrape

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "the", "dog", "is", "in", "paris", "capital", "of"]


def sentences(n: int) -> list[str]:
    rng = np.random.default_rng(7)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 30)))) for _ in range(n)]


@pytest.fixture(scope="module")
def patient_server(tiny_repo):
    """The oldest queued input waits up to 1 s for company, so concurrent calls meet in a batch even when a
    loaded machine spreads their arrival (the shared tiny_server waits 5 ms)."""
    from tests.helpers.server import ServerThread

    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], max_queue_delay_ms=1000) as server:
        yield server


def test_64_concurrent_calls_equal_one_batched_call(patient_server):
    texts = sentences(64)
    before = scrape(patient_server.metrics_url)
    with Client(patient_server.address, timeout=60) as client:
        batched = client.embed(texts, model="tiny-embed")
        assert batched.metadata.batches >= 1
        futures = [
            client.stub.Embed.future(pb.EmbedRequest(inputs=[t], model="tiny-embed"), timeout=60)
            for t in texts
        ]
        singles = [f.result() for f in futures]
    one = batched.vectors
    many = np.array([s.embeddings[0].values for s in singles])
    assert np.abs(one - many).max() <= 1e-5
    assert [s.metadata.input_tokens[0] for s in singles] == list(batched.metadata.input_tokens)

    after = scrape(patient_server.metrics_url)
    labels = {"model": "tiny-embed"}
    batches = metric(after, "bertserve_batch_size_count", **labels) - metric(
        before, "bertserve_batch_size_count", **labels
    )
    inputs = metric(after, "bertserve_batch_size_sum", **labels) - metric(
        before, "bertserve_batch_size_sum", **labels
    )
    singles_only = metric(after, "bertserve_batch_size_bucket", le="1.0", **labels) - metric(
        before, "bertserve_batch_size_bucket", le="1.0", **labels
    )
    assert inputs == 128
    assert batches < 64, "the concurrent calls were never batched together"
    assert singles_only < batches, "no batch held more than one input"


def test_metrics_parse_and_move(tiny_server):
    before = scrape(tiny_server.metrics_url)
    with Client(tiny_server.address, timeout=30) as client:
        client.embed(["a cat", "a dog"], model="tiny-embed")
        client.fill_mask(["the [MASK] sat"], model="tiny-mlm")
        client.classify(["a cat"], model="tiny-classifier")
        with pytest.raises(grpc.RpcError):
            client.embed([""], model="tiny-embed")
    after = scrape(tiny_server.metrics_url)

    def moved(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert moved("bertserve_requests_total", rpc="Embed", code="OK") == 1
    assert moved("bertserve_requests_total", rpc="Embed", code="INVALID_ARGUMENT") == 1
    assert moved("bertserve_requests_total", rpc="FillMask", code="OK") == 1
    assert moved("bertserve_request_duration_seconds_count", rpc="Classify") == 1
    assert moved("bertserve_inputs_total", model="tiny-embed", task="embed") == 2
    assert moved("bertserve_inputs_total", model="tiny-mlm", task="fill_mask") == 1
    # Batch metrics are labelled by encoder: tiny-classifier's encoder graph is byte-identical to
    # tiny-embed's (same random weights), so its classify input ran on the tiny-embed encoder's queue.
    assert moved("bertserve_inputs_total", model="tiny-classifier", task="classify") == 1
    assert moved("bertserve_queue_duration_seconds_count", model="tiny-embed") == 3
    assert moved("bertserve_inference_duration_seconds_count", model="tiny-mlm", graph="encoder") == 1
    assert metric(after, "bertserve_queue_duration_seconds_count", model="tiny-classifier") == 0
    assert moved("bertserve_batch_tokens_sum", model="tiny-embed") >= 8
    assert moved("bertserve_padding_ratio_count", model="tiny-embed") >= 1
    assert metric(after, "bertserve_queue_depth", model="tiny-embed") == 0
    assert metric(after, "bertserve_dropped_total", model="tiny-embed", reason="deadline") >= 0
    for name in ("tiny-embed", "tiny-mlm", "tiny-classifier"):
        assert metric(after, "bertserve_model_info", model=name, version="1", precision="fp32") == 1
