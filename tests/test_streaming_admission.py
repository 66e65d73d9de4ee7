"""Stream admission against hostile clients (issue 30, rows 3 and 4): many EmbedStreams that send and never
read. Streams beyond max_concurrent_streams are refused at once with RESOURCE_EXHAUSTED (and counted);
streams count against max_concurrent_rpcs with unary calls; the server's RSS stays under the bound of
service/grpc/stream_memory.py, unary calls keep answering, and RSS comes back once the streams are cancelled.

Before: streams were not counted at all (40 opened against a limit of 4), and gRPC read megabytes ahead of
every stream nobody read from (BDP-grown windows): 300 such streams took +1.5 GB in 16 s here.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import psutil
import pytest

from bertserve.client import Client
from bertserve.service.grpc.stream_memory import stream_bytes
from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc
from tests.helpers.server import ServerProcess, ServerThread, metric, scrape, wait_for

MODEL = "tiny-embed"
STREAM_LIMIT = 8
STREAMS = 24  # three times the limit
WINDOW = 128  # max_stream_inputs_in_flight's default
TEXT = "the quick brown fox jumps over the lazy dog near the river bank " * 30  # ~2,000 characters
INPUTS = 32
MAX_REQUESTS = 2_000  # per stream: 130 MB of text each if nothing held the client back
NOT_READING_S = 6.0
ANSWER_BYTES = 4 * 48 + 16  # the tiny model's 48 float32 values per input, with framing
# RSS moves for reasons of its own (allocator arenas, gRPC's buffers for the refused calls, the unary
# calls beside the streams): room for that on top of the streams' bound
NOISE = 16 * 2**20


def _flood(stop: threading.Event):
    for i in range(MAX_REQUESTS):
        if stop.is_set():
            return
        yield pb.EmbedStreamRequest(id=i, inputs=[TEXT] * INPUTS, model=MODEL, truncate=True)


def test_streams_that_never_read_are_bounded_in_number_and_memory(tiny_repo):
    server = ServerProcess(
        "--model-repo", str(tiny_repo), "--model", MODEL, "--max-concurrent-streams", str(STREAM_LIMIT)
    ).start()
    try:
        process = psutil.Process(server.process.pid)
        request_bytes = pb.EmbedStreamRequest(inputs=[TEXT] * INPUTS, model=MODEL).ByteSize()
        bound = STREAM_LIMIT * stream_bytes(WINDOW, len(TEXT), ANSWER_BYTES, request_bytes)
        with Client(server.address, timeout=60) as client:
            list(client.embed_stream([TEXT] * 100, model=MODEL, truncate=True))  # warm every path
            client.embed([TEXT], model=MODEL, truncate=True)
            baseline = process.memory_info().rss
            stop = threading.Event()
            channels = [grpc.insecure_channel(server.address) for _ in range(4)]
            stubs = [inference_pb2_grpc.InferenceStub(channel) for channel in channels]
            calls = [
                stubs[k % 4].EmbedStream(_flood(stop), timeout=120) for k in range(STREAMS)
            ]  # never read
            refused_count = ("bertserve_requests_total", {"rpc": "EmbedStream", "code": "RESOURCE_EXHAUSTED"})
            wait_for(
                lambda: (
                    metric(scrape(server.metrics_url), refused_count[0], **refused_count[1])
                    == STREAMS - STREAM_LIMIT
                ),
                timeout=30,
            )
            wait_for(lambda: sum(call.done() for call in calls) == STREAMS - STREAM_LIMIT, timeout=30)
            refused = [call for call in calls if call.done()]
            for call in refused:
                assert call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert f"max_concurrent_streams {STREAM_LIMIT}" in call.details()

            started, peak, latencies = time.monotonic(), baseline, []
            while time.monotonic() - started < NOT_READING_S:
                began = time.perf_counter()
                client.embed(["a unary call beside the streams"], model=MODEL)
                latencies.append(time.perf_counter() - began)
                peak = max(peak, process.memory_info().rss)
                stop.wait(0.1)
            samples = scrape(server.metrics_url)
            assert metric(samples, "bertserve_streams_open") == STREAM_LIMIT
            growth = peak - baseline
            print(
                f"\n{STREAMS} streams not read ({STREAM_LIMIT} admitted): RSS +{growth / 2**20:.1f} MiB "
                f"(bound {bound / 2**20:.1f} MiB + {NOISE / 2**20:.0f}); unary p50 "
                f"{statistics.median(latencies) * 1000:.0f} ms over {len(latencies)} calls"
            )
            assert growth < bound + NOISE, f"server RSS grew by {growth / 2**20:.0f} MiB"
            assert statistics.median(latencies) < 2.0

            stop.set()
            for call in calls:
                call.cancel()
            wait_for(lambda: metric(scrape(server.metrics_url), "bertserve_streams_open") == 0, timeout=30)
            # what the streams held is handed back (the idle release, service/grpc/admission.py)
            wait_for(lambda: process.memory_info().rss - baseline < NOISE, timeout=30)
            assert client.embed(["still serving"], model=MODEL).vectors.shape[0] == 1
            assert metric(scrape(server.metrics_url), "bertserve_queue_depth", model=MODEL) == 0
            for channel in channels:
                channel.close()
        assert server.terminate() == 0
    finally:
        server.kill()


def test_open_streams_count_against_max_concurrent_rpcs(tiny_repo):
    release = threading.Event()

    def one_then_wait():
        yield pb.EmbedStreamRequest(id=0, inputs=["a cat"], model=MODEL)
        release.wait(30)

    with (
        ServerThread(model_repo=tiny_repo, models=[MODEL], max_concurrent_rpcs=2) as server,
        Client(server.address, timeout=30) as client,
    ):
        try:
            calls = [client.stub.EmbedStream(one_then_wait()) for _ in range(2)]
            for call in calls:
                assert next(call).id == 0  # both streams are open
            with pytest.raises(grpc.RpcError) as raised:
                client.embed(["refused while two streams are open"], model=MODEL)
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_concurrent_rpcs 2" in raised.value.details()
        finally:
            release.set()
        for call in calls:
            list(call)
        assert client.embed(["served once they ended"], model=MODEL).vectors.shape[0] == 1


def test_a_call_refused_by_a_full_queue_costs_no_tokenization(tiny_repo):
    """Admission before work (issue 30, row 4): room in the queue is taken before a call is tokenized, so
    a refused call, over gRPC or HTTP (through the same core), tokenizes nothing."""
    import httpx

    queue = 4
    # the first call's inputs wait up to 10 s for company: the queue stays full while the others come
    with (
        ServerThread(
            model_repo=tiny_repo, models=[MODEL], max_queue_inputs=queue, max_queue_delay_ms=10_000
        ) as server,
        Client(server.address, timeout=60) as client,
        ThreadPoolExecutor(1) as pool,
    ):
        before = scrape(server.metrics_url)
        holding = pool.submit(client.embed, ["held in the queue"] * queue, model=MODEL)
        wait_for(lambda: metric(scrape(server.metrics_url), "bertserve_queue_depth", model=MODEL) == queue)
        with pytest.raises(grpc.RpcError) as raised:
            client.embed(["refused: the queue is full"], model=MODEL)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_queue_inputs" in raised.value.details()
        body = {"model": MODEL, "input": ["refused over HTTP too"]}
        answer = httpx.post(f"{server.http_url}/v1/embeddings", json=body, timeout=30)
        assert answer.status_code == 429
        after = scrape(server.metrics_url)
        tokenized = metric(after, "bertserve_tokenized_inputs_total", model=MODEL) - metric(
            before, "bertserve_tokenized_inputs_total", model=MODEL
        )
        assert tokenized == queue  # the held call's inputs, none of the refused calls'
        assert holding.result(60).vectors.shape[0] == queue
