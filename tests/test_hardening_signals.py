"""Signals to `bertserve serve`: SIGHUP drains like SIGTERM (calls in flight are answered, exit 0), and a
drain with 200 open grpc.health.v1 Watch streams is quiet: one log line per stage, no ERROR, no traceback.

Before: SIGHUP killed the server at once (exit -1, calls in flight failed with UNAVAILABLE); a SIGTERM with
200 Watch streams open logged up to 200 ERROR lines and 400 tracebacks (gRPC's "Exception not handled by
_handle_exceptions in servicer method [/grpc.health.v1.Health/Watch]": Watch streams never end on their
own, and those cancelled as the server stops are logged).
"""

from __future__ import annotations

import asyncio
import re
import signal
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc
from tests.helpers.server import ServerProcess, metric, scrape

CALLS = 48
INPUTS_PER_CALL = 4
WATCH_STREAMS = 200
DRAIN_LINES = ("signal received (SIG", "draining: ", "stopped (every accepted call answered)")
TEXT = "a sentence long enough to keep the model busy for a little while " * 4


def _wait_accepted(server: ServerProcess, inputs: int) -> None:
    deadline = time.monotonic() + 60
    while metric(scrape(server.metrics_url), "bertserve_inputs_total") < inputs:  # every call accepted
        assert time.monotonic() < deadline, "the calls were not all accepted"
        time.sleep(0.02)  # the server's metrics are the only view of what it accepted


def _calls_in_flight(server: ServerProcess, channel: grpc.Channel) -> list[grpc.Future]:
    """CALLS Embed calls, every one accepted by the server and some still unanswered."""
    stub = inference_pb2_grpc.InferenceStub(channel)
    calls = [
        stub.Embed.future(pb.EmbedRequest(inputs=[f"{k} {TEXT}"] * INPUTS_PER_CALL), timeout=120)
        for k in range(CALLS)
    ]
    _wait_accepted(server, CALLS * INPUTS_PER_CALL)
    assert not all(c.done() for c in calls), "the load finished before the signal; make it heavier"
    return calls


def test_sighup_drains_like_sigterm(default_repo):
    server = ServerProcess("--model-repo", str(default_repo), "--grace-period-s", "60").start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            calls = _calls_in_flight(server, channel)
            server.process.send_signal(signal.SIGHUP)
            assert all(len(c.result().embeddings) == INPUTS_PER_CALL for c in calls)
        assert server.process.wait(60) == 0
        for line in DRAIN_LINES:
            assert line in server.output, server.output
        assert "SIGHUP" in server.output
    finally:
        server.kill()


async def _open_watches(channel: grpc.aio.Channel, count: int) -> list:
    health = health_pb2_grpc.HealthStub(channel)
    streams = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(count)]
    first = await asyncio.gather(*(s.read() for s in streams))
    assert all(r.status == health_pb2.HealthCheckResponse.SERVING for r in first)
    return streams


async def _ending(stream) -> tuple[list[int], str]:
    """The statuses a Watch stream sent until it ended, and how it ended."""
    statuses = []
    try:
        while (reply := await stream.read()) is not grpc.aio.EOF:
            statuses.append(reply.status)
    except grpc.aio.AioRpcError as error:
        return statuses, error.code().name
    return statuses, "OK"


async def _drain_with_watches(server: ServerProcess, calls_channel: grpc.Channel):
    """WATCH_STREAMS streams on two connections and CALLS calls in flight; SIGTERM; the first connection's
    streams are read to their end, the second connection hangs up at once (both happen to clients during
    a rollout). Returns each read stream's statuses, how it ended and when, and when each call ended."""
    staying, leaving = grpc.aio.insecure_channel(server.address), grpc.aio.insecure_channel(server.address)
    read = await _open_watches(staying, WATCH_STREAMS // 2)
    await _open_watches(leaving, WATCH_STREAMS // 2)
    calls = await asyncio.to_thread(_calls_in_flight, server, calls_channel)
    calls_ended: list[float] = []
    for call in calls:
        call.add_done_callback(lambda _: calls_ended.append(time.monotonic()))
    server.process.send_signal(signal.SIGTERM)
    await leaving.close()

    async def ending(stream):
        statuses, end = await _ending(stream)
        return statuses, end, time.monotonic()

    endings = await asyncio.gather(*(ending(s) for s in read))
    await asyncio.to_thread(lambda: [c.result() for c in calls])
    await staying.close()
    return endings, calls_ended


def test_drain_with_open_watch_streams_is_quiet(default_repo):
    """The streams are told NOT_SERVING and ended (UNAVAILABLE) by the drain itself, while calls are still
    being answered, not cancelled when the server stops; the log has one line per stage and no error."""
    server = ServerProcess("--model-repo", str(default_repo), "--grace-period-s", "60").start()
    try:
        with grpc.insecure_channel(server.address) as calls_channel:
            endings, calls_ended = asyncio.run(_drain_with_watches(server, calls_channel))
        assert server.process.wait(60) == 0
        output = server.output
        assert "Traceback" not in output, output[-3000:]
        assert not re.search(r" (ERROR|CRITICAL) ", output), output[-3000:]
        for line in DRAIN_LINES:
            assert output.count(line) == 1, output
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        assert all(statuses[-1:] == [not_serving] and end == "UNAVAILABLE" for statuses, end, _ in endings)
        assert max(at for _, _, at in endings) < max(calls_ended), "the streams outlived the drain"
    finally:
        server.kill()
