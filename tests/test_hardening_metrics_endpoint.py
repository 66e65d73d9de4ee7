"""The /metrics endpoint (service/metrics_http.py): what it serves and its bounds against idle and slow
clients.

prometheus_client's own server (which bertserve used before) holds a thread per connection and never
times one out: 300 idle connections make 300 threads that stay. Here 300 idle connections and 20 that
trickle their request a byte at a time leave the thread count where it was, a scrape is still answered at
once, and every such connection is closed by the request deadline.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bertserve.service.metrics import Metrics
from bertserve.service.metrics_http import MetricsHTTPServer

IDLE_CONNECTIONS = 300
TRICKLING_CONNECTIONS = 20
MAX_CONNECTIONS = 64
REQUEST_TIMEOUT_S = 1.0


def _status(url: str, method: str = "GET") -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_a_server_serves_its_metrics_limits_and_process_collectors_on_metrics_only(tiny_repo):
    from tests.helpers.server import ServerThread, metric, scrape

    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], max_queue_inputs=300) as server:
        samples = scrape(server.metrics_url)
        limits = {
            dict(labels)["name"]: value
            for (name, labels), value in samples.items()
            if name == "bertserve_limit"
        }
        assert (
            limits["max_queue_inputs"] == 300 and limits["max_batch_size"] == server.settings.max_batch_size
        )
        maxima = {name for name in type(server.settings).model_fields if name.startswith("max_")}
        assert set(limits) == maxima | {"workers", "engines"} and limits["workers"] == limits["engines"] == 1
        assert metric(samples, "process_resident_memory_bytes") > 0
        assert (
            metric(samples, "python_info") == 1 and metric(samples, "python_gc_objects_collected_total") > 0
        )
        base = server.metrics_url.removesuffix("/metrics")
        for path in ("/", "/healthz", "/metrics/", "/metricsx", "/favicon.ico"):
            assert _status(base + path) == 404, path
        assert _status(server.metrics_url + "?name[]=python_info") == 200
        assert _status(server.metrics_url, "HEAD") == 200
        assert _status(server.metrics_url, "POST") == 405


@pytest.fixture
def endpoint():
    server = MetricsHTTPServer(
        Metrics().registry, max_connections=MAX_CONNECTIONS, request_timeout_s=REQUEST_TIMEOUT_S
    )
    port = server.start("127.0.0.1", 0)
    yield server, port
    server.stop()


def _closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_and_slow_connections_hold_no_threads_and_are_closed_by_the_deadline(endpoint):
    server, port = endpoint
    threads_before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(IDLE_CONNECTIONS)]
    trickling = [socket.create_connection(("127.0.0.1", port)) for _ in range(TRICKLING_CONNECTIONS)]
    opened = time.monotonic()
    try:
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        for byte in request[:8]:  # a byte at a time: each read resets no timer, the deadline is total
            for sock in trickling:
                # the server may already have evicted it to make room (the cap is full): not an error
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    sock.sendall(bytes([byte]))
            time.sleep(0.05)
        assert threading.active_count() <= threads_before  # no thread per connection
        assert server.connections <= MAX_CONNECTIONS
        started = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            families = {f.name for f in text_string_to_metric_families(response.read().decode())}
        assert time.monotonic() - started < 2.0  # a scrape is served while the cap is full of idle ones
        assert {"process_resident_memory_bytes", "bertserve_queue_depth"} <= families
        # (How many were evicted so far depends on how fast the server accepted them: not asserted.)
        # Every connection is closed by the server within the request deadline (plus scheduling margin).
        left = REQUEST_TIMEOUT_S + 3.0 - (time.monotonic() - opened)
        still_open = [s for s in idle + trickling if not _closed_by_peer(s, max(0.01, left))]
        assert still_open == []
        assert server.connections == 0
    finally:
        for sock in idle + trickling:
            sock.close()


def test_an_oversized_request_head_is_cut_off(endpoint):
    server, port = endpoint
    with socket.create_connection(("127.0.0.1", port)) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # cut off while sending: fine
            sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Junk: " + b"a" * 20_000 + b"\r\n\r\n")
        assert _closed_by_peer(sock, REQUEST_TIMEOUT_S + 3.0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
