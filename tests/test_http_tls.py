"""HTTPS: with TLS configured the HTTP port speaks TLS with the gRPC port's certificate (and requires
client certificates with tls_client_ca); plaintext HTTP to it gets a plaintext 400. Silent connections
to the HTTPS port count against http_max_connections from accept, before their handshake."""

from __future__ import annotations

import logging
import socket
import ssl
import time

import grpc
import httpx
import psutil
import pytest

from bertserve.client import Client
from tests.helpers.server import ServerThread, metric, scrape, wait_for
from tests.test_server_tls import pki, tls_server_settings  # noqa: F401  (the certificates and settings fixtures)


def test_https_uses_the_tls_settings(tls_server_settings, pki):  # noqa: F811
    trust = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    common = tls_server_settings
    with ServerThread(**common) as server:
        url = f"https://127.0.0.1:{server.server.http_port}"
        assert server.server.http.scheme == "https"
        assert httpx.get(f"{url}/health", verify=trust, timeout=10).status_code == 200
        plain = httpx.get(f"http://127.0.0.1:{server.server.http_port}/health", timeout=10)
        assert plain.status_code == 400 and "plain HTTP request sent to the HTTPS port" in plain.text
    with ServerThread(**common, tls_client_ca=pki / "ca.pem") as server:
        url = f"https://127.0.0.1:{server.server.http_port}"
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", verify=trust, timeout=10)  # no client certificate
        identified = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        identified.load_cert_chain(pki / "client.pem", pki / "client-key.pem")
        reply = httpx.post(f"{url}/v1/embeddings", json={"input": "a cat"}, verify=identified, timeout=30)
        assert reply.status_code == 200 and len(reply.json()["data"][0]["embedding"]) == 48


def _accepted_sockets(port: int) -> int:
    """This process's (the server's) sockets accepted on `port` and still open."""
    return sum(
        1
        for c in psutil.Process().net_connections("tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def _handshake_timeouts(samples) -> float:
    return metric(samples, "bertserve_http_connections_total", outcome="handshake_timeout")


def test_silent_connections_to_the_https_port_are_counted_before_their_handshake(
    tls_server_settings,  # noqa: F811
    pki,  # noqa: F811
    caplog,
):
    """200 silent TCP connections against a cap of 16: 16 wait for their handshake (until the read
    timeout, 3 s), the others are closed at once and counted; gRPC over TLS answers meanwhile, HTTPS once the
    handshakes time out, and the log has no line per refused connection."""
    trust = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    ca = (pki / "ca.pem").read_bytes()
    with (
        caplog.at_level(logging.INFO),
        ServerThread(**tls_server_settings, http_max_connections=16, http_read_timeout_s=3.0) as server,
    ):
        port = server.server.http_port
        before = scrape(server.metrics_url)
        silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(200)]
        try:
            most, deadline = 0, time.monotonic() + 1.5  # within the read timeout: none timed out yet
            while time.monotonic() < deadline:
                most = max(most, _accepted_sockets(port))
                time.sleep(0.05)
            assert most <= 16
            started = time.monotonic()
            with Client(server.address, credentials=grpc.ssl_channel_credentials(ca)) as client:
                assert client.info(timeout=10).models
            assert time.monotonic() - started < 5
            deadline = time.monotonic() + 15
            while True:  # refused until the silent handshakes time out, then answered
                try:
                    reply = httpx.get(f"https://127.0.0.1:{port}/health", verify=trust, timeout=5)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            assert reply.status_code == 200
            # the first freed slot may answer /health before the other handshakes' timeouts are counted
            wait_for(lambda: _handshake_timeouts(scrape(server.metrics_url)) >= 16, timeout=15)
            after = scrape(server.metrics_url)
        finally:
            for sock in silent:
                sock.close()
    refused = metric(after, "bertserve_http_connections_total", outcome="refused") - metric(
        before, "bertserve_http_connections_total", outcome="refused"
    )
    assert refused >= 200 - 16 and _handshake_timeouts(after) >= 16
    assert len(caplog.records) < 50  # no line (or traceback) per connection
