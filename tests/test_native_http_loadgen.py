"""The bench's native HTTP load generator (bench/native/http_loadgen.cc through bench/native_loadgen.py)
against a small HTTP/1.1 server on loopback: what it sends, on how many connections, what it records, and
how it meets a server that closes connections, answers late or not at all.

The server answers each POST with its body after a delay; bodies naming "fail" get 503 and an error body,
"close" answers with `Connection: close`, "hang" is never answered; a body over 1 MiB starting "early" is
answered 413 before it is read (and the connection closed), one starting "reset" is cut with a reset."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from bertserve.bench import native_loadgen
from bertserve.bench.loadgen import Request
from bertserve.bench.native_loadgen import NativeMethod, NativePhase


def _failure(status: int, body: bytes) -> str:
    return f"{status} {json.loads(body)['error']['code']}"


ECHO = NativeMethod("/echo", lambda request: request.texts[0].encode(), lambda reply: reply, _failure)


@pytest.fixture(scope="module")
def binary():
    native_loadgen.choose("native")  # builds both, as the bench does
    return native_loadgen.http_binary()


class EchoServer:
    def __init__(self, delay_s: float = 0.0, close_idle: bool = False):
        self.delay_s, self.close_idle = delay_s, close_idle
        self.received: list[bytes] = []
        self.peers: set[int] = set()  # client ports: one per connection
        self.connections = self.in_flight = self.most_in_flight = 0
        self.heads: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.peers.add(writer.get_extra_info("peername")[1])
        try:
            while True:
                try:
                    head = (await reader.readuntil(b"\r\n\r\n")).decode()
                except asyncio.IncompleteReadError:
                    return
                self.heads.append(head)
                length = int(next(line for line in head.split("\r\n") if line.lower().startswith("content-length"))
                             .split(":")[1])  # fmt: skip
                if length > BIG:
                    if not await self.refuse(reader, writer, length):
                        return
                    continue
                body = await reader.readexactly(length)
                self.received.append(body)
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                try:
                    if b"hang" in body:
                        await asyncio.sleep(3600)
                    await asyncio.sleep(self.delay_s)
                finally:
                    self.in_flight -= 1
                status, reply, close = 200, body, b"close" in body
                if b"fail" in body:
                    status, reply = 503, json.dumps({"error": {"code": "UNAVAILABLE"}}).encode()
                extra = "Connection: close\r\n" if close else ""
                writer.write(
                    f"HTTP/1.1 {status} X\r\nContent-Length: {len(reply)}\r\n{extra}\r\n".encode() + reply
                )
                await writer.drain()
                if close or self.close_idle:
                    return  # close_idle: without saying so, as a server's keep-alive timeout does
        finally:
            writer.close()

    async def refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, length: int) -> bool:
        """Answers a large body early: "reset" with a reset (False: the connection is gone); else 413 at
        once, then, without a word of closing, its body read to the end, and the connection goes on."""
        start = await reader.readexactly(5)
        self.received.append(start)
        if start == b"reset":
            writer.transport.abort()
            return False
        reply = json.dumps({"error": {"code": "INVALID_ARGUMENT"}}).encode()
        writer.write(b"HTTP/1.1 413 X\r\nContent-Length: %d\r\n\r\n" % len(reply) + reply)
        await asyncio.sleep(0.2)  # the client reads the answer while its body is still going out
        try:
            await reader.readexactly(length - 5)
        except (asyncio.IncompleteReadError, ConnectionError):
            return False  # the client closed it
        return True

    @contextlib.asynccontextmanager
    async def serving(self):
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        try:
            yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        finally:
            server.close()


BIG = 1 << 20


def _requests(names: list[str]) -> list[Request]:
    return [Request([name], 2, 10.0) for name in names]


def _run(echo: EchoServer, requests, warmup=(), **phase_args):
    async def go():
        async with echo.serving() as address:
            phase = NativePhase(binary_path[0], address, ECHO, requests, warmup=warmup, **phase_args)
            try:
                await phase.warm_up()
                warmed = list(echo.received)
                return warmed, await asyncio.wait_for(phase.measure(), 30)
            finally:
                await phase.close()

    return asyncio.run(go())


binary_path: list = []


@pytest.fixture(autouse=True)
def _binary(binary):
    binary_path[:] = [binary]


def test_closed_loop_sends_each_request_once_on_a_connection_per_caller(binary):
    echo = EchoServer(delay_s=0.01)
    requests = _requests([f"t{i}" for i in range(40)] + ["fail-0"])
    warmed, result = _run(echo, requests, _requests(["w0", "w1", "w2"]), concurrency=4, connections=4)
    assert warmed == [b"w0", b"w1", b"w2"]  # the warm-up, all of it before `measure`
    assert sorted(echo.received[3:]) == sorted(r.texts[0].encode() for r in requests)  # each exactly once
    assert echo.most_in_flight == 4 and echo.connections == 4  # kept alive from the warm-up on
    assert result.errors == {"503 UNAVAILABLE": 1}
    assert (result.inputs, len(result.latencies)) == (40, 40) and min(result.latencies) >= 0.01
    assert result.client_cpu_s > 0 and result.mode == "closed" and not result.stopped_early
    head = echo.heads[0].lower()
    assert head.startswith("post /echo http/1.1\r\n") and "x-request-timeout: 300" in head


def test_callers_wait_for_one_of_the_connections_asked_for(binary):
    echo = EchoServer(delay_s=0.01)
    _, result = _run(echo, _requests([f"t{i}" for i in range(30)]), concurrency=6, connections=2)
    assert len(result.latencies) == 30 and echo.most_in_flight == 2 and len(echo.peers) == 2


def test_connections_the_server_closes_are_opened_again(binary):
    echo = EchoServer()
    names = [f"close-{i}" if i % 3 == 0 else f"t{i}" for i in range(30)]
    _, result = _run(echo, _requests(names), concurrency=3, connections=3)
    # one opened again after each close while requests were left
    assert len(result.latencies) == 30 and result.errors == {} and 3 + 7 <= echo.connections <= 3 + 10
    # closed without a word once idle (between the warm-up and the phase, and after each answer)
    idle = EchoServer(close_idle=True)
    warmup = _requests(["w0", "w1"])
    _, result = _run(idle, _requests([f"t{i}" for i in range(10)]), warmup, concurrency=2, connections=2)
    # each request that met a connection closed since its last answer sent again on a new one
    assert result.errors == {} and len(result.latencies) == 10 and idle.received.count(b"t9") <= 2


def test_a_request_past_its_timeout_counts_deadline_exceeded_and_the_rest_go_on(binary):
    echo = EchoServer()
    requests = _requests(["hang"] + [f"t{i}" for i in range(10)])
    _, result = _run(echo, requests, concurrency=2, timeout_s=0.5, connections=2)
    assert result.errors == {"DEADLINE_EXCEEDED": 1} and len(result.latencies) == 10


def test_open_loop_keeps_its_schedule_on_more_connections_when_the_server_is_slow(binary):
    echo = EchoServer(delay_s=0.2)
    _, result = _run(echo, _requests([f"r{i}" for i in range(20)]), rate=200.0, connections=64)
    # closed loop at concurrency 1 would need 20 x 0.2 s; arrivals every ~5 ms overlap the slow calls
    assert result.seconds < 3.0 and len(result.latencies) == 20 and result.mode == "open"
    assert min(result.latencies) >= 0.2 and echo.most_in_flight > 10 and echo.connections == len(echo.peers)


def test_a_phase_stops_sending_at_its_time_limit_and_awaits_what_it_sent(binary):
    for rate in (None, 100.0):
        echo = EchoServer(delay_s=0.1)
        _, result = _run(echo, _requests([f"r{i}" for i in range(100)]), concurrency=2, rate=rate,
                         time_limit_s=0.3, connections=64)  # fmt: skip
        assert result.stopped_early and 0 < len(result.latencies) < 100 and result.errors == {}, rate
        assert result.seconds < 1.0, rate  # no request sent after 0.3 s, each answered in 0.1 s


def test_a_request_refused_or_reset_before_it_is_all_sent_ends_its_connection_alone(binary):
    """A 413 that comes while the body is still going out closes that connection (the rest of the body
    would come before the next request; the server did not say it closes),
    a reset fails its request UNAVAILABLE; the requests after them are answered on new connections."""
    echo = EchoServer()
    big = 4 * BIG
    names = ["t0", "early" + "x" * big, "t1", "reset" + "x" * big, "t2"]
    _, result = _run(echo, _requests(names), concurrency=1, connections=1, timeout_s=10)
    assert result.errors == {"413 INVALID_ARGUMENT": 1, "UNAVAILABLE": 1} and len(result.latencies) == 3
    assert [b for b in echo.received if len(b) < 10] == [b"t0", b"early", b"t1", b"reset", b"reset", b"t2"][
        : len([b for b in echo.received if len(b) < 10])
    ]
