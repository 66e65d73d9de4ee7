"""The bench's HTTP clients (bench/http_client.py, and the native one it drives; the server-fp32-http target)
against a live server: each request answered once over a few keep-alive connections, with the server's
metadata; failures counted under the gRPC status name the server reports."""

from __future__ import annotations

import asyncio

from bertserve.bench import http_client, native_loadgen
from bertserve.bench.loadgen import Request, closed_loop
from bertserve.bench.native_loadgen import NativePhase


def test_http_closed_loop_counts_answers_and_failures(tiny_server):
    requests = [Request([f"text number {i}"], tokens=5, flops=1.0) for i in range(40)]

    async def run(model: str):
        pool = http_client.HttpPool("127.0.0.1", tiny_server.server.http_port, 4)
        try:
            return await closed_loop(http_client.embed_call(pool, model, 30.0), requests, 8), pool
        finally:
            await pool.close()

    result, pool = asyncio.run(run("tiny-embed"))
    assert len(result.latencies) == 40 and not result.errors and result.inputs == 40
    assert result.reply_tokens > 40 and len(result.queue_ms) == 40
    assert pool._opened <= 4  # keep-alive: at most one connection per caller slot
    failed, _ = asyncio.run(run("no-such-model"))
    assert failed.errors == {"NOT_FOUND": 40} and not failed.latencies


def test_native_http_load_generator_records_answers_and_failures(tiny_server):
    """The same calls through bench/native/http_loadgen.cc, as the bench sends them when it is built."""
    native_loadgen.choose("native")
    requests = [Request([f"text number {i}"], tokens=5, flops=1.0) for i in range(40)]
    address = f"127.0.0.1:{tiny_server.server.http_port}"

    async def run(model: str):
        method = http_client.native_embed(model)
        phase = NativePhase(native_loadgen.http_binary(), address, method, requests, 8, connections=4)
        try:
            await phase.warm_up()
            return await phase.measure()
        finally:
            await phase.close()

    result = asyncio.run(run("tiny-embed"))
    assert len(result.latencies) == 40 and not result.errors and result.inputs == 40
    assert result.reply_tokens > 40 and len(result.queue_ms) == 40 and result.client_cpu_s > 0
    failed = asyncio.run(run("no-such-model"))
    assert failed.errors == {"NOT_FOUND": 40} and not failed.latencies
