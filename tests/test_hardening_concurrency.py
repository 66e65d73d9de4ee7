"""A burst of calls far beyond what the server runs at once: every call is answered OK or refused with
RESOURCE_EXHAUSTED (none CANCELLED or UNAVAILABLE), every refusal is counted in
`bertserve_requests_total{code="RESOURCE_EXHAUSTED"}` as the client counted it, and the server stays SERVING.

Before the bound, gRPC's own limit on calls it holds before the server takes them (1,000 soft, 3,000 hard)
cancelled about 15% of a burst of 3,000 one-input calls (5,700 of 10,000 in the adversarial run) with
CANCELLED before any handler saw them, and no metric counted them.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc
from tests.helpers.server import ServerProcess, metric, scrape

BURST = 2500
MAX_CONCURRENT_RPCS = 40
ADMISSION_REFUSAL = "max_concurrent_rpcs"


@pytest.fixture(scope="module")
def server(tiny_repo):
    running = ServerProcess(
        "--model-repo",
        str(tiny_repo),
        "--model",
        "tiny-embed",
        "--max-concurrent-rpcs",
        str(MAX_CONCURRENT_RPCS),
        # Calls wait up to 200 ms for company and a batch holds up to 64 inputs: whether the client sends fast
        # (batches fill to 64 > 40 calls) or slowly (each call waits 200 ms), more than 40 calls are in flight
        # at once, so the bound is reached however fast this shared machine runs the client.
        "--max-batch-size",
        "64",
        "--max-queue-delay-ms",
        "200",
    ).start()
    yield running
    assert running.terminate() == 0


async def _burst(address: str) -> tuple[list[tuple[str, str]], int]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        await stub.Embed(pb.EmbedRequest(inputs=["warm up"]), timeout=30)

        async def one(k: int) -> tuple[str, str]:
            try:
                await stub.Embed(pb.EmbedRequest(inputs=[f"call number {k} of the burst"]), timeout=120)
            except grpc.aio.AioRpcError as error:
                return error.code().name, error.details() or ""
            return "OK", ""

        outcomes = await asyncio.gather(*(one(k) for k in range(BURST)))
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        return outcomes, health.status


def test_burst_is_answered_ok_or_refused_and_counted(server):
    before = scrape(server.metrics_url)
    outcomes, health = asyncio.run(_burst(server.address))
    after = scrape(server.metrics_url)
    codes = Counter(code for code, _ in outcomes)
    by_admission = sum(1 for code, details in outcomes if ADMISSION_REFUSAL in details)
    print(
        f"\nhardening figures concurrency: {json.dumps({'burst': BURST, **codes, 'by_admission': by_admission})}"
    )

    def counted(code: str) -> float:
        return metric(after, "bertserve_requests_total", code=code) - metric(
            before, "bertserve_requests_total", code=code
        )

    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert by_admission > 0, "the burst went beyond max_concurrent_rpcs"
    assert codes["OK"] > 0
    assert counted("RESOURCE_EXHAUSTED") == codes["RESOURCE_EXHAUSTED"]
    assert counted("OK") == codes["OK"] + 1  # and the warm-up call
    assert health == health_pb2.HealthCheckResponse.SERVING


def test_calls_whose_requests_arrive_together_do_not_overshoot_the_limit(tiny_repo, monkeypatch):
    """gRPC reads a unary request after the interceptor admits it: large requests sent together all passed
    the interceptor's check before any started (up to 13 in flight against a limit of 4). The limit holds
    as the calls start: at most 4 reach the core at once, the others are refused and counted. (Without the
    check at the start, a round overshoots about three times in four: two rounds are run.)"""
    from bertserve.service.core.core import InferenceCore
    from tests.helpers.server import ServerThread

    limit, calls = 4, 40
    running, peak = [0], [0]
    infer = InferenceCore.infer

    async def counted(self, *args, **kwargs):
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        try:
            return await infer(self, *args, **kwargs)
        finally:
            running[0] -= 1

    monkeypatch.setattr(InferenceCore, "infer", counted)
    request = pb.EmbedRequest(inputs=["wo " * 2600] * 256, truncate=True)  # 2 MB: read over many frames
    codes = Counter()
    settings = {"max_concurrent_rpcs": limit, "max_queue_inputs": 100_000}
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], **settings) as server:
        for _ in range(2):
            channels = [grpc.insecure_channel(server.address) for _ in range(8)]  # requests read in parallel
            stubs = [inference_pb2_grpc.InferenceStub(channel) for channel in channels]
            futures = [stubs[i % len(stubs)].Embed.future(request, timeout=120) for i in range(calls)]
            for future in futures:
                try:
                    future.result()
                    codes["OK"] += 1
                except grpc.RpcError as error:
                    codes[error.code().name] += 1
            for channel in channels:
                channel.close()
            assert peak[0] <= limit, f"{peak[0]} calls in the core at once; max_concurrent_rpcs {limit}"
        samples = scrape(server.metrics_url)
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"} and codes["OK"] >= 2, codes
    counted_refusals = metric(samples, "bertserve_requests_total", rpc="Embed", code="RESOURCE_EXHAUSTED")
    assert counted_refusals == codes["RESOURCE_EXHAUSTED"]
