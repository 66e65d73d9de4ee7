"""Hostile HTTP clients over raw sockets: oversize bodies (413 before reading them), huge headers (431),
slow headers and bodies (408), idle and excess connections, malformed requests, pipelining; the server
keeps answering HTTP and gRPC. Each bound is set small here, so each test fails without its bound."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

import grpc
import pytest

from bertserve.service.errors import StartupError
from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc
from tests.helpers.server import ServerThread, metric, scrape, wait_for

MAX_BYTES = 65536
READ_TIMEOUT_S = 0.5
MAX_CONNECTIONS = 16
HEALTH = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"


@pytest.fixture(scope="module")
def server(tiny_repo):
    with ServerThread(
        model_repo=tiny_repo,
        models=["tiny-embed"],
        max_message_bytes=MAX_BYTES,
        http_read_timeout_s=READ_TIMEOUT_S,
        http_keep_alive_s=READ_TIMEOUT_S,
        http_max_connections=MAX_CONNECTIONS,
    ) as running:
        yield running


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.server.http_port), timeout=10)


def slow_reader(server) -> socket.socket:
    """A connection whose client reads nothing and whose receive buffer is small, so the server soon holds
    what it sends."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", server.server.http_port))
    return sock


EMBED_48 = json.dumps({"input": ["a"] * 48, "encoding_format": "float"}).encode()  # ~46 KB answers


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def exchange(server, data: bytes) -> bytes:
    with connect(server) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)  # the server may answer and close before reading it all: what we test for
        return read_all(sock)


def assert_healthy(server) -> None:
    with connect(server) as sock:
        sock.sendall(HEALTH.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        assert status_of(read_all(sock)) == 200
    with grpc.insecure_channel(server.address) as channel:
        assert inference_pb2_grpc.InferenceStub(channel).Info(pb.InfoRequest(), timeout=10).models


def post_head(length: int | None = None, extra: str = "") -> bytes:
    framing = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return f"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{framing}{extra}\r\n".encode()


def test_declared_oversize_body_is_413_before_it_is_sent(server):
    with connect(server) as sock:
        sock.sendall(post_head(10**9))  # not one byte of the body follows
        reply = read_all(sock)
    assert status_of(reply) == 413 and f"max_message_bytes {MAX_BYTES}".encode() in reply
    assert_healthy(server)


def test_chunked_body_is_counted_and_refused_past_the_limit(server):
    chunk = b"4000\r\n" + b"a" * 0x4000 + b"\r\n"  # 16 KiB chunks, 5 of them: more than 64 KiB
    reply = exchange(server, post_head() + chunk * 5 + b"0\r\n\r\n")
    assert status_of(reply) == 413 and b"more than max_message_bytes" in reply
    assert_healthy(server)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        (f"X-Big: {'a' * 40_000}\r\n", b"more than 32768 bytes"),
        ("".join(f"X-{i}: v\r\n" for i in range(101)), b"more than 100 fields"),
    ],
    ids=["bytes", "fields"],
)
def test_huge_headers_are_431(server, headers, message):
    reply = exchange(server, f"GET /health HTTP/1.1\r\nHost: t\r\n{headers}\r\n".encode())
    assert status_of(reply) == 431 and message in reply
    assert_healthy(server)


@pytest.mark.parametrize(
    ("sent", "waiting_for"),
    [
        (b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\n", b"request headers"),
        (post_head(100) + b'{"in', b"request body"),
    ],
    ids=["headers", "body"],
)
def test_slow_clients_get_408_after_the_read_timeout(server, sent, waiting_for):
    started = time.monotonic()
    reply = exchange(server, sent)  # and then nothing
    elapsed = time.monotonic() - started
    assert status_of(reply) == 408 and waiting_for in reply
    assert READ_TIMEOUT_S * 0.9 <= elapsed < READ_TIMEOUT_S + 5
    assert_healthy(server)


def test_idle_connections_are_closed(server):
    started = time.monotonic()
    with connect(server) as silent, connect(server) as kept_alive:
        kept_alive.sendall(HEALTH)
        assert status_of(kept_alive.recv(65536)) == 200
        assert read_all(silent) == b"" and read_all(kept_alive) == b""  # closed by the server, no answer
    assert time.monotonic() - started < READ_TIMEOUT_S + 5


def test_malformed_request_is_400(server):
    reply = exchange(server, b"NOT A REQUEST\r\n\r\n")
    assert status_of(reply) == 400 and b"malformed HTTP request" in reply
    assert_healthy(server)


def test_pipelined_requests_are_answered_in_order(server):
    models = b"GET /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    reply = exchange(server, HEALTH + models)
    first, second = reply.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200") and b'"live"' in first
    assert second.startswith(b"200") and b"tiny-embed" in second


def test_expect_100_continue(server):
    body = b'{"input": "a dog"}'
    with connect(server) as sock:
        sock.sendall(post_head(len(body), "Expect: 100-continue\r\nConnection: close\r\n"))
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        reply = read_all(sock)
    assert status_of(reply) == 200 and b'"embedding"' in reply


def test_kept_alive_connections_past_the_cap_are_evicted_fresh_ones_are_not(server):
    """Beyond the cap a new connection closes one idle after an answer (keep-alive); one that has sent
    nothing yet may have its request in flight: never evicted, so the newcomer gets 503 instead."""
    kept = [connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in kept:
            sock.sendall(HEALTH)
            assert status_of(sock.recv(65536)) == 200
        for _ in range(MAX_CONNECTIONS):  # each closes one kept-alive connection
            assert (
                status_of(exchange(server, HEALTH.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")))
                == 200
            )
        assert all(read_all(sock) == b"" for sock in kept)  # closed by the server, no answer
    finally:
        for sock in kept:
            sock.close()
    wait_for(lambda: server.server.http.server.open == 0)
    fresh = [connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        wait_for(lambda: server.server.http.server.open == MAX_CONNECTIONS)
        refused = exchange(server, HEALTH)
        assert status_of(refused) == 503 and b"too many connections" in refused
        assert all(read_all(sock) == b"" for sock in fresh)  # closed after the read timeout, not evicted
    finally:
        for sock in fresh:
            sock.close()
    assert_healthy(server)


def test_busy_connections_refuse_new_ones(server):
    core, release, all_held = server.server.core, threading.Event(), threading.Event()
    real_embed, held = core.embed, []

    async def held_embed(*args, **kwargs):
        held.append(1)  # on the server's loop: no race
        if len(held) == MAX_CONNECTIONS:
            all_held.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)
        return await real_embed(*args, **kwargs)

    core.embed = held_embed
    body = b'{"input": "a"}'
    busy = [connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in busy:
            sock.sendall(post_head(len(body), "Connection: close\r\n") + body)
        assert all_held.wait(30)  # every connection is being answered
        refused = exchange(server, HEALTH)
        assert status_of(refused) == 503 and b"too many connections" in refused
    finally:
        release.set()
        core.embed = real_embed
        replies = [read_all(sock) for sock in busy]
        for sock in busy:
            sock.close()
    assert [status_of(r) for r in replies] == [200] * MAX_CONNECTIONS
    assert_healthy(server)


def test_response_over_max_message_bytes_is_refused_with_the_limit(server):
    body = json.dumps({"input": ["a"] * 256, "encoding_format": "float"}).encode()  # ~250 KB of JSON floats
    reply = exchange(server, post_head(len(body), "Connection: close\r\n") + body)
    assert status_of(reply) == 400 and f"more than max_message_bytes {MAX_BYTES}".encode() in reply
    assert_healthy(server)


def test_http_off_and_port_taken(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], http_port=-1) as running:
        assert running.server.http is None and running.server.http_port is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StartupError, match=f"setting http_port: cannot listen on 127.0.0.1:{port}"):
            ServerThread(model_repo=tiny_repo, models=["tiny-embed"], http_port=port).start()


def test_client_that_does_not_read_its_answers_is_cut_off(server):
    """Pipelined requests whose answers (about 9 MB) the client never reads: once the server's send buffer
    is full it waits http_read_timeout_s for the client to read, then aborts the connection."""
    request = post_head(len(EMBED_48)) + EMBED_48

    def open_connections() -> float:
        return metric(scrape(server.metrics_url), "bertserve_http_connections_open")

    wait_for(lambda: open_connections() == 0, timeout=30)  # earlier tests' kept-alive connections closed
    sock = slow_reader(server)
    with sock:
        wait_for(lambda: open_connections() == 1, timeout=30)
        with contextlib.suppress(OSError):
            sock.sendall(request * 200)
        # a client that does not read, until the server gives up on it (however slowly a loaded machine
        # computes the answers that fill its send buffer)
        wait_for(lambda: open_connections() == 0, timeout=240)
        received = read_all(sock)
    assert received.count(b"HTTP/1.1 200") < 200  # cut off, not every answer buffered for it
    assert_healthy(server)


def _send_until_an_answer_is_held(server, sock: socket.socket, request: bytes) -> None:
    """Sends `request` one at a time, each answered, until the kernel's buffers are full and the server
    holds part of an answer for a client that reads nothing (one it waits on is not counted answered)."""
    for sent in range(1, 400):
        sock.sendall(request)
        deadline = time.monotonic() + 30
        while (found := _connection_of(server, sock))[1] < sent and not found[2]:
            assert time.monotonic() < deadline, "the request was never answered"
            time.sleep(0.01)
        if found[2]:
            return
    raise AssertionError("the kernel took every answer: the server never held one back")


def _connection_of(server, sock: socket.socket):
    """The server's Connection for our socket (None once it is gone), and the bytes its transport holds."""

    async def find():
        for connection in server.server.http.server.connections:
            transport = connection.transport
            if transport is not None and transport.get_extra_info("peername") == sock.getsockname():
                return connection, connection.answered, transport.get_write_buffer_size()
        return None, 0, 0

    return server.call(find)


def test_connection_closed_with_an_unread_answer_still_buffered_is_aborted(server):
    """A keep-alive connection whose last answer the kernel could not take whole (the client reads
    nothing): closing it at the keep-alive timeout would wait forever for that answer to be sent, holding
    its connection slot. It is aborted http_read_timeout_s later, as an unread answer is."""
    request = post_head(len(EMBED_48)) + EMBED_48
    sock = slow_reader(server)
    with sock:
        _send_until_an_answer_is_held(server, sock, request)
        wait_for(lambda: _connection_of(server, sock)[0] is None, 4 * READ_TIMEOUT_S + 5)
        assert server.server.http.server.open <= MAX_CONNECTIONS
    assert_healthy(server)


def test_a_connection_still_sending_its_answer_is_not_evicted_as_idle(tiny_repo):
    """At the connection cap a new connection evicts the oldest idle one; a connection whose last answer
    the server still holds (its client reads nothing) is not idle: closing it would keep its socket open
    beyond the cap until it is aborted. The idle one opened after it is evicted instead."""
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], http_max_connections=2) as server:
        request = post_head(len(EMBED_48)) + EMBED_48
        slow = slow_reader(server)
        with slow, connect(server) as idle:
            _send_until_an_answer_is_held(server, slow, request)
            idle.sendall(HEALTH)
            assert status_of(idle.recv(65536)) == 200
            with connect(server) as fresh:
                fresh.sendall(HEALTH.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
                assert status_of(read_all(fresh)) == 200
            assert read_all(idle) == b""  # the idle connection was evicted
            assert _connection_of(server, slow)[0] is not None  # the sending one was not
