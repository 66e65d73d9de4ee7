"""EmbedStream flow control against a hostile client: one that sends as fast as it can and never reads.

The server (a `bertserve serve` process, RSS via psutil) reads a stream's next request only while the
stream's inputs in flight (answered AND sent) are below max_stream_inputs_in_flight; a client that does
not read blocks the server's writes, so the server stops reading and HTTP/2 flow control stops the
client's sends. Without that bound the server keeps reading: every request it reads waits for
tokenization and its answer waits to be written, and RSS grows with what the client sends (measured with
the window raised to 100,000: +139 MiB in the 10 s, against +11 to +17 MiB with the default window).
"""

from __future__ import annotations

import threading
import time

import psutil

from bertserve.client import Client
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.server import ServerProcess, metric, scrape, wait_for

MODEL = "tiny-embed"
NOT_READING_S = 10.0
RSS_GROWTH_LIMIT = 50 * 2**20
TEXT = "the quick brown fox jumps over the lazy dog near the river bank " * 30  # ~2,000 characters
MAX_REQUESTS = 20_000  # 32 inputs each: 1.2 GB of text if nothing held the client back


def test_a_client_that_never_reads_keeps_server_memory_flat(tiny_repo):
    server = ServerProcess("--model-repo", str(tiny_repo), "--model", MODEL).start()
    try:
        process = psutil.Process(server.process.pid)
        with Client(server.address, timeout=120) as client:
            # warm up every path the stream uses, then take the baseline
            list(client.embed_stream([TEXT] * 200, model=MODEL, truncate=True))
            baseline = process.memory_info().rss
            sent = 0
            stop = threading.Event()

            def flood():
                nonlocal sent
                for i in range(MAX_REQUESTS):
                    if stop.is_set():
                        return
                    sent += 1
                    yield pb.EmbedStreamRequest(id=i, inputs=[TEXT] * 32, model=MODEL, truncate=True)

            call = client.stub.EmbedStream(flood(), timeout=120)  # never read
            started = time.monotonic()
            peak = baseline
            while time.monotonic() - started < NOT_READING_S:
                stop.wait(0.25)  # sampling RSS while the flood runs
                peak = max(peak, process.memory_info().rss)
            stop.set()
            call.cancel()
            growth = peak - baseline
            print(f"sent {sent} requests in {NOT_READING_S:.0f} s; server RSS +{growth / 2**20:.1f} MiB")
            assert growth < RSS_GROWTH_LIMIT, f"server RSS grew by {growth / 2**20:.0f} MiB"
            assert sent < MAX_REQUESTS, "the client's sends were never held back"
            # the server is healthy afterwards, and the cancelled stream is gone
            assert client.embed(["still serving"], model=MODEL).vectors.shape[0] == 1
            # the server sees the cancel asynchronously: its stream handler ends in its own time
            wait_for(lambda: metric(scrape(server.metrics_url), "bertserve_streams_open") == 0, timeout=30)
            wait_for(lambda: metric(scrape(server.metrics_url), "bertserve_queue_depth", model=MODEL) == 0)
            samples = scrape(server.metrics_url)
            # never more than the window (max_stream_inputs_in_flight, 128 by default) in flight
            assert metric(samples, "bertserve_stream_inputs_in_flight_bucket", le="128.0") == metric(
                samples, "bertserve_stream_inputs_in_flight_count"
            )
        assert server.terminate() == 0
    finally:
        server.kill()
