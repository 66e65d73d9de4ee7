"""Hostile HTTP clients, round 3 (issue 30): a header value that never ends (431 at the limit), a client
that disconnects while its inputs are queued (dropped and counted CANCELLED), a burst of connections far
past the cap (each answered 200 or 503, and counted), request targets httptools rejects (400, no
traceback), HEAD, Expect, and the transport's counts on /metrics."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import resource
import time

import pytest

from bertserve.client import Client
from bertserve.service.errors import StartupError
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.server import GatedBatches, ServerThread, metric, scrape, wait_for
from tests.test_http_robustness import HEALTH, connect, exchange, post_head, read_all, status_of

MAX_CONNECTIONS = 16
MAX_HEADER_BYTES = 32 * 1024  # HttpLimits' default
CLOSE = b"Connection: close\r\n\r\n"


@pytest.fixture(scope="module")
def server(tiny_repo):
    with ServerThread(
        model_repo=tiny_repo,
        models=["tiny-embed"],
        http_read_timeout_s=20,
        http_keep_alive_s=20,
        http_max_connections=MAX_CONNECTIONS,
        max_queue_inputs=1024,
    ) as running:
        yield running


def delta(before: dict, after: dict, name: str, **labels) -> float:
    return metric(after, name, **labels) - metric(before, name, **labels)


def test_a_header_value_that_never_ends_gets_431_at_the_limit(server):
    """The bytes of an unfinished header are counted as they arrive: 431 once there are more than
    max_header_bytes, not at the header's end (which never comes) nor at the read timeout."""
    head = b"GET /health HTTP/1.1\r\nHost: t\r\nX-Endless: "
    socks = [connect(server) for _ in range(8)]
    try:
        for sock in socks:
            sock.settimeout(5)  # well under the read timeout (20 s): only the header limit can answer
            sock.sendall(head + b"a" * (MAX_HEADER_BYTES + 8192))  # and the value goes on, unfinished
        started = time.monotonic()
        with connect(server) as health:
            health.sendall(HEALTH.replace(b"\r\n\r\n", b"\r\n" + CLOSE))
            assert status_of(read_all(health)) == 200
        assert time.monotonic() - started < 5
        for sock in socks:
            reply = read_all(sock)
            assert status_of(reply) == 431 and f"more than {MAX_HEADER_BYTES} bytes".encode() in reply
    finally:
        for sock in socks:
            sock.close()


def test_a_client_that_disconnects_has_its_queued_inputs_dropped(server):
    """256 inputs queued behind a gated batch; the client closes its socket after 0.3 s: the handler is
    cancelled, the inputs are dropped before compute (dropped_total{reason="cancelled"}) and the request
    is counted CANCELLED, never OK."""
    before = scrape(server.metrics_url)
    rpc = "http:/v1/embeddings"
    with GatedBatches(server.server.models[0]) as gate, Client(server.address) as client:
        busy = client.stub.Embed.future(pb.EmbedRequest(inputs=["a"]), timeout=30)
        assert gate.computing.wait(30)
        body = json.dumps({"input": [f"input {i}" for i in range(256)]}).encode()
        with connect(server) as sock:
            sock.sendall(post_head(len(body)) + body)
            wait_for(
                lambda: metric(scrape(server.metrics_url), "bertserve_queue_depth", model="tiny-embed") > 0
            )
            time.sleep(0.3)
        wait_for(lambda: delta(before, scrape(server.metrics_url), "bertserve_requests_total", rpc=rpc) == 1)
        gate.release()
        assert len(busy.result().embeddings) == 1
    wait_for(
        lambda: delta(before, scrape(server.metrics_url), "bertserve_dropped_total", reason="cancelled") > 0
    )
    after = scrape(server.metrics_url)
    assert delta(before, after, "bertserve_requests_total", rpc=rpc, code="CANCELLED") == 1
    assert delta(before, after, "bertserve_requests_total", rpc=rpc, code="OK") == 0
    # every input of the request that had not reached a running batch is dropped
    assert delta(before, after, "bertserve_dropped_total", model="tiny-embed", reason="cancelled") >= 200


def test_a_burst_far_past_the_cap_gets_an_answer_for_every_connection(server):
    """200 connections at once against a cap of 16, each sending a request: each gets 200 or 503 (never
    a reset or silence), and the server's counts equal what the clients saw."""
    before = scrape(server.metrics_url)
    body = b'{"input": "a dog"}'
    request = post_head(len(body), "Connection: close\r\n") + body
    socks = []
    try:
        for _ in range(
            200
        ):  # all connected first: the server sees fresh connections whose request is on its way
            socks.append(connect(server))
        time.sleep(0.2)
        for sock in socks:
            with contextlib.suppress(OSError):  # refused already: the server may have closed before this
                sock.sendall(request)
        statuses = [status_of(read_all(sock)) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    assert set(statuses) <= {200, 503} and len(statuses) == 200
    answered, refused = statuses.count(200), statuses.count(503)
    wait_for(lambda: server.server.http.server.open == 0)
    after = scrape(server.metrics_url)
    assert delta(before, after, "bertserve_requests_total", rpc="http:/v1/embeddings", code="OK") == answered
    assert delta(before, after, "bertserve_http_connections_total", outcome="refused") == refused
    assert delta(before, after, "bertserve_http_rejected_total", status="503") == refused
    assert delta(before, after, "bertserve_http_connections_total", outcome="accepted") == answered


@pytest.mark.parametrize(
    "line",
    [b"CONNECT 127.0.0.1:22 HTTP/1.1", b"GET http://[::1 HTTP/1.1", b"GET http://h:99999/x HTTP/1.1"],
)
def test_request_targets_that_are_not_paths_are_400_without_a_traceback(server, line, caplog):
    with caplog.at_level(logging.WARNING):
        reply = exchange(server, line + b"\r\nHost: t\r\n" + CLOSE)
    assert status_of(reply) == 400 and b"request target" in reply
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_head_answers_like_get_without_the_body(server):
    get = exchange(server, b"GET /health HTTP/1.1\r\nHost: t\r\n" + CLOSE)
    head = exchange(server, b"HEAD /health HTTP/1.1\r\nHost: t\r\n" + CLOSE)
    get_head, get_body = get.split(b"\r\n\r\n", 1)
    assert status_of(head) == 200 and head.endswith(b"\r\n\r\n")
    assert f"content-length: {len(get_body)}".encode() in head and get_body
    refused = exchange(server, b"HEAD /v1/embeddings HTTP/1.1\r\nHost: t\r\n" + CLOSE)
    assert status_of(refused) == 405 and b"allow: POST" in refused


def test_expect_other_than_100_continue_is_417(server):
    body = b'{"input": "a"}'
    reply = exchange(server, post_head(len(body), "Expect: 200-ok\r\nConnection: close\r\n") + body)
    assert status_of(reply) == 417 and b"100-continue" in reply


def test_transport_refusals_are_metrics(server):
    wait_for(lambda: server.server.http.server.open == 0)
    before = scrape(server.metrics_url)
    assert status_of(exchange(server, b"GET /health HTTP/1.1\r\nX: " + b"a" * 40_000 + b"\r\n\r\n")) == 431
    assert status_of(exchange(server, b"GET /health HTTP/1.1\r\nExpect: x\r\n" + CLOSE)) == 417
    assert status_of(exchange(server, b"NOT A REQUEST\r\n\r\n")) == 400
    wait_for(lambda: server.server.http.server.open == 0)
    kept = []
    try:
        for _ in range(MAX_CONNECTIONS + 3):  # the last 3 each evict one answered before
            kept.append(connect(server))
            kept[-1].sendall(HEALTH)
            assert status_of(kept[-1].recv(65536)) == 200
        after = scrape(server.metrics_url)
        assert metric(after, "bertserve_http_connections_open") == server.server.http.server.open
    finally:
        for sock in kept:
            sock.close()
    assert delta(before, after, "bertserve_http_connections_total", outcome="evicted") == 3
    assert delta(before, after, "bertserve_http_connections_total", outcome="accepted") == MAX_CONNECTIONS + 6
    for status in ("431", "417", "400"):
        assert delta(before, after, "bertserve_http_rejected_total", status=status) == 1
    assert delta(before, after, "bertserve_http_connections_total", outcome="refused") == 0


def test_start_raises_the_open_files_limit_and_refuses_a_cap_above_it(tiny_repo):
    """A server raises its open-files soft limit to the hard limit, and refuses to start when
    http_max_connections (twice: connections and refusals being closed, and a reserve) would not fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard // 2 > 1_000_000 or hard < 4096:
        pytest.skip(f"the hard open-files limit {hard} leaves nothing to check")
    resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    try:
        with ServerThread(model_repo=tiny_repo, models=["tiny-embed"]):
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
        with pytest.raises(StartupError, match="setting http_max_connections: .* open files"):
            ServerThread(model_repo=tiny_repo, models=["tiny-embed"], http_max_connections=hard // 2).start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_requests_pipelined_behind_a_body_are_parsed_one_slice_at_a_time(server, monkeypatch):
    """A body's last bytes followed, in the same read, by 30 KiB of tiny pipelined requests: the parser
    is fed the body up to its end, then request heads one HEAD_SLICE at a time, so the requests parsed
    ahead of their answers (about 300 bytes each as Request objects) stay those of one slice, not a
    read's worth (some 1,700 from 30 KiB)."""
    from bertserve.service.http.transport import HEAD_SLICE, Connection

    tiny = b"GET /health HTTP/1.1\r\n\r\n"
    most = HEAD_SLICE // len(tiny) + 1
    parsed_ahead = []
    complete = Connection.on_message_complete

    def counted(self) -> None:
        complete(self)
        parsed_ahead.append(len(self.pending))

    monkeypatch.setattr(Connection, "on_message_complete", counted)
    body = json.dumps({"input": "a cat"}).encode()
    count = 30 * 1024 // len(tiny)
    with connect(server) as sock:
        sock.sendall(post_head(len(body)) + body[:4])
        time.sleep(0.2)  # the head is parsed: the parser now waits for the body
        sock.sendall(body[4:] + tiny * count + HEALTH.replace(b"\r\n\r\n", b"\r\n" + CLOSE))
        replies = read_all(sock)
    assert replies.count(b"HTTP/1.1 200 OK") == count + 2  # every request answered, in order
    assert len(parsed_ahead) == count + 2
    assert max(parsed_ahead) <= most, f"{max(parsed_ahead)} requests parsed ahead of their answers"


def test_a_large_body_pipelined_behind_a_request_is_not_counted_as_headers(server):
    """A request with a 45 KB body sent right behind another: it is read while the first is answered,
    then parsed from what was kept. Its body's bytes are not counted against the next request's
    max_header_bytes (a spurious 431 after its answer)."""
    first = b'{"input": "a dog"}'  # answered off the event loop: the rest arrives meanwhile, and is kept
    body = b'{"input": "a cat"' + b" " * 45_000 + b"}"
    last = HEALTH.replace(b"\r\n\r\n", b"\r\n" + CLOSE)
    with connect(server) as sock:
        sock.sendall(post_head(len(first)) + first + post_head(len(body)) + body + last)
        replies = read_all(sock)
    statuses = [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", replies)]
    assert statuses == [200, 200, 200], replies[-300:]
