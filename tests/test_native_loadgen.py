"""The bench's native load generator (bench/native_loadgen.py, bench/native/loadgen.cc) against a real
grpc.aio server on loopback: what it sends, when, what it records, and how the bench falls back without it.

The server echoes each request's bytes after a delay and fails the requests it is told to, so every
property is checked against what the server itself saw.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

import grpc
import pytest

from bertserve.bench import native_loadgen, phases
from bertserve.bench.loadgen import Request
from bertserve.bench.native_loadgen import NativeMethod, NativePhase
from bertserve.bench.phases import embed_request, native_embed
from bertserve.v1 import inference_pb2

METHOD = "/bench.test.Echo/Call"
ECHO = NativeMethod(METHOD, lambda request: request.texts[0].encode(), lambda reply: reply)


@pytest.fixture(scope="module")
def binary():
    return native_loadgen.find_binary()  # CI installs g++ and libgrpc++-dev (scripts/system-packages.sh)


class EchoServer:
    """Echoes the request's bytes after `delay_s`; payloads in `fail` get RESOURCE_EXHAUSTED. Records
    every payload it received and the most calls it had in flight at once."""

    def __init__(self, delay_s: float = 0.0, fail: frozenset[bytes] = frozenset()):
        self.delay_s, self.fail = delay_s, fail
        self.received: list[bytes] = []
        self.peers: list[str] = []  # each call's client address: one per connection
        self.in_flight = self.most_in_flight = 0

    async def call(self, payload: bytes, context) -> bytes:
        self.received.append(payload)
        self.peers.append(context.peer())
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        if payload in self.fail:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "full")
        return payload

    @contextlib.asynccontextmanager
    async def serving(self):
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(self.call)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("bench.test.Echo", {"Call": handler}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            yield f"127.0.0.1:{port}"
        finally:
            await server.stop(None)


def _requests(names: list[str]) -> list[Request]:
    return [Request([name], 2, 10.0) for name in names]


def test_closed_loop_sends_each_request_once_at_its_concurrency_after_an_unrecorded_warm_up(binary):
    echo = EchoServer(delay_s=0.01, fail=frozenset({b"t7"}))
    requests, warmup = _requests([f"t{i}" for i in range(40)]), _requests(["w0", "w1", "w2"])

    async def go():
        async with echo.serving() as address:
            phase = NativePhase(binary, address, ECHO, requests, concurrency=4, warmup=warmup)
            await phase.warm_up()
            warmed = list(echo.received)
            return warmed, await phase.measure()

    warmed, result = asyncio.run(go())
    assert warmed == [b"w0", b"w1", b"w2"]  # the warm-up, all of it before `measure`
    assert sorted(echo.received[3:]) == sorted(f"t{i}".encode() for i in range(40))  # each exactly once
    assert echo.most_in_flight == 4
    assert result.errors == {"RESOURCE_EXHAUSTED": 1}
    assert (result.inputs, result.tokens, result.flops, len(result.latencies)) == (39, 78, 390.0, 39)
    assert min(result.latencies) >= 0.01 and result.seconds >= 10 * 0.01  # 40 calls of 10 ms, 4 at a time
    assert not result.stopped_early and result.concurrency == 4 and result.mode == "closed"
    assert result.client_cpu_s > 0  # the child's CPU over the measured part


@pytest.mark.parametrize("rate", [None, 200.0])
def test_calls_are_spread_over_the_connections_asked_for(binary, rate):
    """A server whose front processes share a port gets each connection in one of them: `connections`
    opens that many, each closed-loop caller keeps its own, an open loop goes round-robin."""
    echo = EchoServer(delay_s=0.005)
    requests = _requests([f"t{i}" for i in range(30)])

    async def go(connections: int) -> list[str]:
        echo.peers.clear()
        async with echo.serving() as address:
            phase = NativePhase(binary, address, ECHO, requests, 6, rate=rate, connections=connections)
            await phase.warm_up()
            await phase.measure()
        return list(echo.peers)

    spread, one = asyncio.run(go(3)), asyncio.run(go(1))
    assert len(spread) == len(one) == 30
    assert len(set(spread)) == 3 and len(set(one)) == 1
    per_connection = sorted(collections.Counter(spread).values())
    if rate:  # round-robin
        assert per_connection == [10, 10, 10]
    else:  # two callers each, whose calls stay on their connection
        assert min(per_connection) >= 3


def test_a_closed_loop_on_several_threads_sends_each_request_once_at_its_concurrency(binary):
    """Threads share a closed loop's connections (a fast server is not bounded by one client thread): every
    request goes once, the concurrency holds, each caller keeps its connection, all are recorded."""
    echo = EchoServer(delay_s=0.02, fail=frozenset({b"t3"}))
    requests = _requests([f"t{i}" for i in range(60)])

    async def go(threads: int):
        echo.received.clear()
        echo.peers.clear()
        async with echo.serving() as address:
            warm = _requests(["w"])
            phase = NativePhase(binary, address, ECHO, requests, 6, warm, connections=6, threads=threads)
            await phase.warm_up()
            return await phase.measure()

    result = asyncio.run(go(3))
    assert result.client_threads == 3  # the child says how many threads sent the measured part
    assert sorted(echo.received[1:]) == sorted(f"t{i}".encode() for i in range(60))
    assert echo.most_in_flight == 6
    per_connection = collections.Counter(echo.peers[1:])
    assert len(per_connection) == 6 and min(per_connection.values()) >= 3  # each caller kept its own
    assert result.errors == {"RESOURCE_EXHAUSTED": 1} and len(result.latencies) == 59
    assert not result.stopped_early and min(result.latencies) >= 0.02
    assert asyncio.run(go(1)).client_threads == 1


def test_the_python_clients_channels_each_open_a_connection():
    echo = EchoServer()

    async def go() -> set[str]:
        async with echo.serving() as address:
            channels = [phases.own_channel(address) for _ in range(3)]
            for channel in channels:
                await channel.unary_unary(METHOD)(b"x")
            for channel in channels:
                await channel.close()
        return set(echo.peers)

    assert len(asyncio.run(go())) == 3


def test_open_loop_keeps_its_schedule_when_the_server_is_slow(binary):
    echo = EchoServer(delay_s=0.2)
    requests = _requests([f"r{i}" for i in range(20)])

    async def go():
        async with echo.serving() as address:
            phase = NativePhase(binary, address, ECHO, requests, rate=200.0)
            await phase.warm_up()
            return await phase.measure()

    result = asyncio.run(go())
    # closed loop at concurrency 1 would need 20 x 0.2 s; arrivals every ~5 ms overlap the slow calls
    # (about 0.3 s; the rest is slack for a loaded machine)
    assert result.seconds < 3.0 and len(result.latencies) == 20 and result.mode == "open"
    assert min(result.latencies) >= 0.2 and echo.most_in_flight > 10


def test_a_phase_stops_sending_at_its_time_limit_and_awaits_what_it_sent(binary):
    echo = EchoServer(delay_s=0.1)
    requests = _requests([f"r{i}" for i in range(100)])

    async def go():
        async with echo.serving() as address:
            phases = []
            for rate in (None, 100.0):
                phase = NativePhase(binary, address, ECHO, requests, 2, rate=rate, time_limit_s=0.3)
                await phase.warm_up()
                phases.append(await phase.measure())
            return phases

    for result in asyncio.run(go()):
        assert result.stopped_early, result.mode
        assert 0 < len(result.latencies) < 100 and result.errors == {}, result.mode
        assert result.seconds < 1.0, result.mode  # no request sent after 0.3 s, each answered in 0.1 s


def test_an_open_loop_ends_at_its_time_limit_with_nothing_in_flight_and_sends_nothing_scheduled_after_it(
    binary, monkeypatch
):
    # fixed send times instead of Poisson ones; the time limit is 0.3 s (r1 well before it, so that a
    # loaded machine's late timer does not push it past the limit)
    monkeypatch.setattr(native_loadgen, "poisson_offsets", lambda n, rate, seed: [0.0, 0.15, 0.4, 0.5][:n])
    requests = _requests(["r0", "r1", "r2", "r3"])

    async def go(delay_s):
        echo = EchoServer(delay_s=delay_s)
        async with echo.serving() as address:
            phase = NativePhase(binary, address, ECHO, requests, rate=1.0, time_limit_s=0.3, timeout_s=5)
            await phase.warm_up()
            try:
                return echo, await asyncio.wait_for(phase.measure(), 10)
            finally:
                await phase.close()

    # replies at 0.1 and 0.25 s: after the second nothing is in flight and r2, r3 are still planned
    # (the phase used to wait for a reply that could not come)
    echo, result = asyncio.run(go(0.1))
    assert result.stopped_early and len(result.latencies) == 2 and echo.received == [b"r0", b"r1"]
    # replies at 0.5 and 0.65 s: r2 is due at 0.4 s, while both are in flight, but after the time limit
    echo, result = asyncio.run(go(0.5))
    assert result.stopped_early and len(result.latencies) == 2 and echo.received == [b"r0", b"r1"]


def test_a_cancelled_warm_up_leaves_no_child_and_no_files(binary):
    echo = EchoServer(delay_s=5.0)

    async def go():
        async with echo.serving() as address:
            phase = NativePhase(binary, address, ECHO, _requests(["a"]), warmup=_requests(["w"]))
            task = asyncio.create_task(phase.warm_up())
            while not echo.received:  # the child is connected and its warm-up request is in the server
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return phase

    phase = asyncio.run(go())
    assert phase._process.returncode is not None and phase._scratch is None


def test_a_cached_binary_that_does_not_start_is_built_again(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTSERVE_CACHE_DIR", str(tmp_path))
    stale = native_loadgen.cached_binary()
    stale.write_text("#!/bin/sh\nexit 127\n")  # as the loader does when a shared library is gone
    stale.chmod(0o755)
    monkeypatch.setenv("CXX", "false")  # the build that replaces it fails here, so the bench falls back
    binary, record = native_loadgen.choose("native")
    assert binary is None and "compiling loadgen.cc failed" in record["native_unavailable"]


def test_a_server_that_is_not_there_fails_the_phase_with_the_reason(binary, monkeypatch):
    monkeypatch.setattr(native_loadgen, "READY_TIMEOUT_S", 5.0)
    with socket_bound_and_closed() as address:
        phase = NativePhase(binary, address, ECHO, _requests(["a"]))
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="cannot connect|did not get ready"):
            asyncio.run(phase.warm_up())
        assert time.monotonic() - started < 15


@contextlib.contextmanager
def socket_bound_and_closed():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"127.0.0.1:{port}"


def test_embed_requests_are_the_python_clients_bytes():
    request = Request(["a b", "c"], 5, 1.0)
    sent = native_embed("m").payload(request)
    assert sent == embed_request(["a b", "c"], "m").SerializeToString()
    assert inference_pb2.EmbedRequest.FromString(sent).truncate  # the bench always truncates


def test_without_a_compiler_the_bench_falls_back_to_the_python_client(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTSERVE_CACHE_DIR", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CXX", "false")  # a compiler that always fails
    binary, record = native_loadgen.choose("native")
    assert (
        binary is None
        and record["kind"] == "python"
        and "compiling loadgen.cc failed" in record["native_unavailable"]
    )
    assert native_loadgen.choose("python") == (None, {"kind": "python", "asked": "python"})
    assert list(tmp_path.iterdir()) == []  # no half-built binary left behind


def test_an_unwritable_cache_falls_back_too(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("BERTSERVE_CACHE_DIR", str(blocked / "cache"))
    binary, record = native_loadgen.choose("native")
    assert binary is None and "cannot build in" in record["native_unavailable"]
