"""Attention through admission, honest wait estimates, and an event loop free of response building, on
a `bertserve serve` subprocess (its own process, so the test client never competes for its GIL).

The model is small but not tiny (hidden 192, 2 layers, 4 heads, inputs of 256 tokens): one Attention call
returns 2 x 4 maps of 256 x 256 probabilities (2 MiB) and takes tens of milliseconds to compute.

- 200 Attention calls queued: a one-input Embed still answers within 1 s (median of 20; it waits for at most one
  attention run), and its metadata's queue + inference + tokenize times agree with what the client
  measured (before, the wait behind attention runs was reported as inference, and was seconds).
- After the burst, a 64 x 256-token Embed with a 30 s deadline is accepted on the empty queue.
- While 100 Attention calls and large Embeds have their responses built, grpc.health.v1 Check answers
  within 100 ms (median of 60 checks, p95 within 500 ms; the server's largest event-loop lag at most 1 s):
  responses are built and serialized off the event loop.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertserve.v1 import inference_pb2 as pb
from tests.helpers.server import ServerProcess, metric, scrape

MEDIUM = dict(hidden_size=192, num_hidden_layers=2, num_attention_heads=4, intermediate_size=384)
LONG_TEXT = " ".join(["the cat sat on the mat"] * 42) + " a dog"  # 254 words: 256 tokens with [CLS] [SEP]
ATTENTION_CALLS = 200
EMBED_PROBES = 20
SERVICE = "/bertserve.v1.Inference/"


@pytest.fixture(scope="module")
def medium_server(tmp_path_factory, make_tiny_checkpoint):
    from bertserve.export.pipeline import export_model

    repo = tmp_path_factory.mktemp("medium-repo")
    checkpoint = make_tiny_checkpoint("BertModel", max_position_embeddings=288, **MEDIUM)
    export_model(checkpoint, repo, name="medium", version=1, attentions=True, log=lambda _: None)
    server = ServerProcess("--model-repo", str(repo)).start()
    try:
        yield server
    finally:
        server.kill()


def call(channel: grpc.aio.Channel, method: str, request, response_type=None, timeout: float = 120):
    """A unary call; the response stays bytes unless a type is given (the client parses nothing it need not)."""
    deserializer = response_type.FromString if response_type else None
    stub = channel.unary_unary(
        SERVICE + method,
        request_serializer=type(request).SerializeToString,
        response_deserializer=deserializer,
    )
    return stub(request, timeout=timeout)


async def queued_depth(server) -> float:
    samples = await asyncio.to_thread(scrape, server.metrics_url)
    return metric(samples, "bertserve_queue_depth", model="medium")


def test_embed_is_not_stuck_behind_queued_attention(medium_server):
    async def main():
        async with grpc.aio.insecure_channel(medium_server.address) as channel:
            idle = await call(channel, "Embed", pb.EmbedRequest(inputs=["a cat"]), pb.EmbedResponse)
            attention = [
                asyncio.ensure_future(call(channel, "Attention", pb.AttentionRequest(input=LONG_TEXT)))
                for _ in range(ATTENTION_CALLS)
            ]
            while await queued_depth(medium_server) < ATTENTION_CALLS // 2:
                await asyncio.sleep(0.02)
            probes = []
            for _ in range(EMBED_PROBES):
                started = time.perf_counter()
                response = await call(channel, "Embed", pb.EmbedRequest(inputs=["a cat"]), pb.EmbedResponse)
                probes.append((time.perf_counter() - started, response.metadata))
            still_queued = sum(not a.done() for a in attention)
            answers = await asyncio.gather(*attention)
            return idle, probes, still_queued, answers

    idle, probes, still_queued, answers = asyncio.run(main())
    assert still_queued >= ATTENTION_CALLS // 4, "the attention calls were not queued during the probes"
    assert len(answers) == ATTENTION_CALLS and all(len(a) > 2 * 4 * 256 * 256 * 4 for a in answers)
    # behind the queue (FIFO), the first probe alone would wait for the queued attention runs, and few would
    # still be queued; the median, as one probe on a shared machine may be held up by its scheduler
    latencies = [seconds for seconds, _ in probes]
    median = statistics.median(latencies)
    assert median <= 1.0, f"Embed median {median:.3f}s behind {ATTENTION_CALLS} queued Attention calls"
    idle_inference_s = idle.metadata.inference_time_ms / 1000
    gaps = []
    for seconds, meta in probes:
        server_s = (meta.queue_time_ms + meta.inference_time_ms + meta.tokenize_time_ms) / 1000
        assert server_s <= seconds + 0.005  # the server's parts fit in what the client saw
        gaps.append(seconds - server_s)
        # the wait behind the queued attention runs is queue time, never inference time (the slack is for a
        # machine shared with other work, where one small batch's compute swings by tens of ms)
        assert meta.inference_time_ms / 1000 <= 10 * idle_inference_s + 0.25
    # and they account for what the client saw, but for transport and scheduling (one call on a busy
    # shared machine may be held up for a few hundred ms; the median is not)
    assert statistics.median(gaps) <= 0.1, f"client - server times: {sorted(gaps)}"


def test_large_embed_after_an_attention_burst_is_accepted(medium_server):
    """The wait estimate counts encoder batches only and the queue ahead: nothing ahead, never refused."""

    async def main():
        async with grpc.aio.insecure_channel(medium_server.address) as channel:
            burst = [call(channel, "Attention", pb.AttentionRequest(input=LONG_TEXT)) for _ in range(40)]
            await asyncio.gather(*burst)
            assert await queued_depth(medium_server) == 0
            request = pb.EmbedRequest(inputs=[LONG_TEXT] * 64)
            return await call(channel, "Embed", request, pb.EmbedResponse, timeout=30)

    response = asyncio.run(main())
    assert len(response.embeddings) == 64 and list(response.metadata.input_tokens) == [256] * 64


def test_health_answers_while_large_responses_are_built(medium_server):
    checks: list[float] = []
    stop = threading.Event()

    def check_health():
        with grpc.insecure_channel(medium_server.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            stub.Check(health_pb2.HealthCheckRequest(), timeout=10)  # connected before the load starts
            while not stop.is_set() and len(checks) < 60:
                started = time.perf_counter()
                stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
                checks.append(time.perf_counter() - started)
                time.sleep(0.05)

    async def load():
        async with grpc.aio.insecure_channel(medium_server.address) as channel:
            calls = [call(channel, "Attention", pb.AttentionRequest(input=LONG_TEXT)) for _ in range(100)]
            texts = [f"the cat {i} sat on the mat" for i in range(256)]
            calls += [call(channel, "Embed", pb.EmbedRequest(inputs=texts)) for _ in range(3)]
            return await asyncio.gather(*calls)

    checker = threading.Thread(target=check_health)
    before = scrape(medium_server.metrics_url)
    checker.start()
    try:
        answers = asyncio.run(load())
        for _ in range(4):  # a fast machine builds them all within 20 checks: again, so that every check
            if len(checks) >= 20:  # is taken while responses are built, whatever the machine's speed
                break
            asyncio.run(load())
    finally:
        stop.set()
        checker.join(60)
    after = scrape(medium_server.metrics_url)
    assert len(answers) == 103 and sum(len(a) for a in answers) > 100 * 2 * 1024 * 1024
    assert len(checks) >= 20
    ordered = sorted(checks)
    p95 = ordered[int(0.95 * len(ordered))]
    # Without off-loop replies Check took 3-7.5 s here. With them: median 7-13 ms and p95 28-109 ms in 16
    # runs, and once 213 ms (a fresh-clone run on the shared machine): p95 is the 3rd-slowest of about 60
    # checks, so one stall of the machine moves it; the median holds the typical case.
    median = statistics.median(checks)
    assert median <= 0.1 and p95 <= 0.5, (
        f"health Check p95 {p95 * 1000:.0f} ms, median {median * 1000:.0f} ms"
    )
    lag_samples = metric(after, "bertserve_event_loop_lag_seconds_count") - metric(
        before, "bertserve_event_loop_lag_seconds_count"
    )
    assert lag_samples > 0
    # the largest of the last 10 s of lag samples: one stall of a shared machine's scheduler may reach
    # hundreds of ms, building the responses on the loop held it for seconds
    assert metric(after, "bertserve_event_loop_lag_max_seconds") <= 1.0
