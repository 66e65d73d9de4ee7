"""Overload and soak against `bertserve serve` (a subprocess on 127.0.0.1, all-MiniLM-L6-v2 fp32, calls of
4 inputs of 39 tokens), with the server's RSS sampled by psutil.

The machines these run on are shared and their speed swings by 20% and more within minutes, so `make test`
asserts only what a slow or noisy machine keeps; throughput and latency ratios are the benchmark's and
`make soak`'s (the long variants, `-m slow`).

- Capacity is measured first (closed loop, 16 callers, so batches are full).
- Overload (`make test`: 8 s at 4x capacity): every call is answered OK or refused with RESOURCE_EXHAUSTED
  and the server counts the same refusals; refusals come at once (far below the accepted calls' wait in
  the full queue); RSS stays flat; afterwards the queue is empty and the next calls wait in no queue.
  `make soak` (30 s) also asserts that accepted throughput holds (at least 0.7 x capacity) and that the
  accepted calls' latency stays under the bound the queue limit implies.
- Soak (`make test`: 30 s at 35% of capacity): no call fails and RSS does not grow after warm-up.
  `make soak`: BERTSERVE_SOAK_SECONDS (600) at 70% of capacity.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time

import grpc
import pytest

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc
from tests.helpers.load import LoadResult, RssSampler, closed_loop, open_loop, percentile
from tests.helpers.server import ServerProcess, metric, scrape

INPUTS_PER_CALL = 4
MAX_QUEUE_INPUTS = 128
OVERLOAD_FACTOR = 4
OVERLOAD_SECONDS = 8
SOAK_SECONDS = 30
SOAK_SHARE = 0.35  # well inside capacity: a busy shared machine still keeps up
LONG_SOAK_SHARE = 0.7
# After the load, the next calls find the queue empty: the server's own queue wait stays tiny.
QUEUE_WAIT_AFTER_LOAD_MS = 100
MAX_BATCH_SIZE = 32  # the server's default
# The client's view adds tokenization, transport and its own scheduling on the same 2 shared cores.
CLIENT_MARGIN = 1.25
SENTENCE = "the quick brown fox jumps over the lazy dog while a small cat watches from the warm window"
WORDS = SENTENCE.split()
long_run = pytest.mark.skipif(
    not os.environ.get("BERTSERVE_SOAK_SECONDS"), reason="long variant: make soak (BERTSERVE_SOAK_SECONDS)"
)


def text(k: int) -> str:
    """37 words, each one token: every input is 39 tokens with [CLS]/[SEP], so batches are never cut short
    by the padding limit and hold max_batch_size inputs under load."""
    return " ".join(WORDS[(k + i) % len(WORDS)] for i in range(37))


def embed_call(stub: inference_pb2_grpc.InferenceStub):
    async def call(k: int):
        inputs = [text(k * INPUTS_PER_CALL + i) for i in range(INPUTS_PER_CALL)]
        return await stub.Embed(pb.EmbedRequest(inputs=inputs), timeout=60)

    return call


async def _with_stub(address: str, body):
    async with grpc.aio.insecure_channel(address) as channel:
        return await body(embed_call(inference_pb2_grpc.InferenceStub(channel)))


def run_load(address: str, body):
    """Runs `body(call)` on a fresh event loop with a grpc.aio channel to `address`."""
    return asyncio.run(_with_stub(address, body))


def report(name: str, figures: dict) -> None:
    print(f"\nhardening figures {name}: {json.dumps(figures)}")


@pytest.fixture(scope="module")
def server(default_repo):
    running = ServerProcess(
        "--model-repo", str(default_repo), "--max-queue-inputs", str(MAX_QUEUE_INPUTS)
    ).start()
    yield running
    assert running.terminate() == 0


@pytest.fixture(scope="module")
def capacity(server):
    """Closed loop, 16 callers x 4 inputs (full batches): calls/s, RSS peak, one lone call's time."""

    async def measure(call):
        lone = []
        for k in range(10):
            started = time.perf_counter()
            await call(k)
            lone.append(time.perf_counter() - started)
        await closed_loop(call, 16, 2.0)  # warm-up: ONNX Runtime's arena grows to full batches
        with RssSampler(server.process.pid) as rss:
            result = await closed_loop(call, 16, 4.0)
        return lone, result, max(rss.between(0))

    lone, result, rss_peak = run_load(server.address, measure)
    assert set(result.codes()) == {"OK"}
    return {
        "calls_per_s": result.rate("OK"),
        "inputs_per_s": result.rate("OK") * INPUTS_PER_CALL,
        "lone_call_s": statistics.median(lone),
        "rss_peak": rss_peak,
    }


def overload(server, capacity, seconds: float, *, ratios: bool) -> dict:
    """`ratios`: also assert throughput and latency against capacity (make soak only)."""
    offered = OVERLOAD_FACTOR * capacity["calls_per_s"]
    before = scrape(server.metrics_url)

    async def body(call):
        with RssSampler(server.process.pid) as rss:
            result: LoadResult = await open_loop(call, offered, seconds)
        after = []  # the load has dropped: the next calls, one at a time
        for k in range(5):
            started = time.perf_counter()
            reply = await call(k)
            after.append((time.perf_counter() - started, reply.metadata.queue_time_ms))
        return result, rss, after

    result, rss, after = run_load(server.address, body)
    samples = scrape(server.metrics_url)
    codes = result.codes()
    assert set(codes) == {"OK", "RESOURCE_EXHAUSTED"}, codes  # every call answered; nothing else went wrong
    refused_here = codes["RESOURCE_EXHAUSTED"]
    refused_by_server = metric(samples, "bertserve_requests_total", rpc="Embed", code="RESOURCE_EXHAUSTED")
    assert refused_by_server - metric(
        before, "bertserve_requests_total", rpc="Embed", code="RESOURCE_EXHAUSTED"
    ) == pytest.approx(refused_here)
    assert metric(samples, "bertserve_queue_depth", model="all-minilm-l6-v2") == 0

    accepted, refused = result.latencies("OK"), result.latencies("RESOURCE_EXHAUSTED")
    # The bound the queue limit implies: a call admitted to a full queue waits for the batch computing and
    # at most max_queue_inputs / max_batch_size full batches ahead, then runs in its own batch. The batch
    # time is the server's own (each reply's metadata: inference time per batch), measured during the overload.
    batch_s = [
        o.reply.metadata.inference_time_ms / o.reply.metadata.batches / 1000
        for o in result.outcomes
        if o.reply
    ]
    bound_s = (MAX_QUEUE_INPUTS / MAX_BATCH_SIZE + 2) * percentile(batch_s, 99)
    figures = {
        "seconds": round(result.seconds, 1),
        "capacity_calls_per_s": round(capacity["calls_per_s"], 1),
        "offered_calls_per_s": round(len(result.outcomes) / seconds, 1),
        "accepted_calls_per_s": round(result.rate("OK"), 1),
        "refused_calls_per_s": round(result.rate("RESOURCE_EXHAUSTED"), 1),
        "refusal_p50_ms": round(1000 * percentile(refused, 50), 1),
        "refusal_p99_ms": round(1000 * percentile(refused, 99), 1),
        "accepted_p50_s": round(percentile(accepted, 50), 3),
        "accepted_p99_s": round(percentile(accepted, 99), 3),
        "accepted_max_s": round(max(accepted), 3),
        "batch_p50_s": round(percentile(batch_s, 50), 3),
        "batch_p99_s": round(percentile(batch_s, 99), 3),
        "accepted_bound_s": round(bound_s, 3),
        "rss_capacity_peak_mib": round(capacity["rss_peak"] / 2**20, 1),
        "rss_overload_peak_mib": round(max(rss.between(0)) / 2**20, 1),
        "lone_call_before_s": round(capacity["lone_call_s"], 4),
        "lone_call_after_s": round(statistics.median(t for t, _ in after), 4),
        "queue_wait_after_ms": round(max(q for _, q in after), 2),
    }
    report(f"overload {seconds:g}s", figures)
    assert refused_here > 0 and len(accepted) > 0
    # Refused at once: never after waiting in the queue, as the accepted calls do.
    assert percentile(refused, 50) <= 0.1 * percentile(accepted, 50)
    assert percentile(refused, 99) <= percentile(accepted, 50)
    # Flat memory: the overload's peak stays within 10% of the peak under full batches at capacity.
    assert max(rss.between(0)) <= 1.10 * capacity["rss_peak"]
    # Recovered at once: the queue is empty, the next calls wait in no queue and are as quick as before.
    assert max(q for _, q in after) <= QUEUE_WAIT_AFTER_LOAD_MS
    assert statistics.median(t for t, _ in after) <= 3 * capacity["lone_call_s"] + 0.1
    if ratios:
        assert result.rate("OK") >= 0.7 * capacity["calls_per_s"]  # throughput holds under overload
        assert percentile(accepted, 99) <= CLIENT_MARGIN * bound_s
    return figures


def soak(server, capacity, seconds: float, share: float) -> dict:
    rate = share * capacity["calls_per_s"]
    warm_up_s = max(10.0, 0.1 * seconds)

    async def body(call):
        with RssSampler(server.process.pid, interval_s=1.0) as rss:
            began = time.perf_counter()
            result = await open_loop(call, rate, seconds)
        return result, rss, began

    result, rss, began = run_load(server.address, body)
    warm = rss.between(0, began + warm_up_s)
    later = rss.between(began + warm_up_s)
    growth = max(later) / max(warm) - 1
    latencies = result.latencies("OK")
    figures = {
        "seconds": round(result.seconds, 1),
        "share_of_capacity": share,
        "offered_calls_per_s": round(rate, 1),
        "calls": len(result.outcomes),
        "codes": dict(result.codes()),
        "p50_s": round(percentile(latencies, 50), 3),
        "p99_s": round(percentile(latencies, 99), 3),
        "rss_warm_up_peak_mib": round(max(warm) / 2**20, 1),
        "rss_later_peak_mib": round(max(later) / 2**20, 1),
        "rss_end_mib": round(later[-1] / 2**20, 1),
        "rss_growth_after_warm_up": round(growth, 4),
    }
    report(f"soak {seconds:g}s", figures)
    assert dict(result.codes()) == {"OK": len(result.outcomes)}  # zero errors, zero refusals
    assert growth <= 0.05
    return figures


def test_overload_at_4x_capacity_is_refused_at_once_and_recovers(server, capacity):
    overload(server, capacity, OVERLOAD_SECONDS, ratios=False)


@pytest.mark.timeout(900)  # measuring capacity, then the soak: slower on a machine shared with other work
def test_soak_well_inside_capacity_has_no_error_and_flat_memory(server, capacity):
    soak(server, capacity, SOAK_SECONDS, SOAK_SHARE)


@pytest.mark.slow
@long_run
def test_overload_at_4x_capacity_for_30_seconds_holds_throughput_and_latency(server, capacity):
    overload(server, capacity, 30, ratios=True)


@pytest.mark.slow
@long_run
@pytest.mark.timeout(int(os.environ.get("BERTSERVE_SOAK_SECONDS", "600")) + 600)
def test_soak_at_70_percent_of_capacity_long(server, capacity):
    soak(server, capacity, float(os.environ["BERTSERVE_SOAK_SECONDS"]), LONG_SOAK_SHARE)
