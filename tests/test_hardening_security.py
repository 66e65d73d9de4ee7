"""Security settings beyond TLS (TLS, mutual TLS and plaintext refused: tests/test_server_tls.py; the image's
non-root user: tests/test_deploy_dockerfile.py; model names that are paths: tests/test_hardening_bad_input.py):
the message size limit is a setting and holds both ways, and /metrics lives on its own port, apart from gRPC,
or nowhere."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request

import grpc
import pytest

from bertserve.client import Client
from tests.helpers.server import ServerThread

LIMIT = 256 * 1024


def texts_of_bytes(total: int) -> list[str]:
    """Inputs of 10,000 characters adding up to about `total` bytes on the wire."""
    return ["cat " * 2500] * max(1, total // 10_000)


def test_the_message_size_limit_is_a_setting(tiny_repo):
    with (
        ServerThread(
            model_repo=tiny_repo, models=["tiny-embed"], max_message_bytes=LIMIT, metrics_port=-1
        ) as server,
        Client(server.address, timeout=30, max_message_bytes=4 * LIMIT) as client,
    ):
        assert client.info().limits.max_message_bytes == LIMIT
        under = texts_of_bytes(LIMIT - 20_000)
        assert len(client.embed(under, truncate=True).vectors) == len(under)
        with pytest.raises(grpc.RpcError) as refused:
            client.embed(texts_of_bytes(LIMIT + 20_000), truncate=True)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"vs. {LIMIT})" in refused.value.details()
        # A small request whose reply would pass the limit (256 inputs x 72 tokens) is refused by the
        # server itself, naming the limit, and counted as failed (gRPC alone would fail it on sending).
        with pytest.raises(grpc.RpcError) as too_big:
            client.tokenize(["paris capital " * 40] * 256, truncate=True)  # 320 KB of tokens
        assert too_big.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "response: " in too_big.value.details()
        assert f"max_message_bytes {LIMIT}" in too_big.value.details()
        assert client.health() == "SERVING"


def test_metrics_on_their_own_port_or_off(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"]) as server:
        assert server.server.metrics_port not in (None, server.server.port)
        with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
            assert b"bertserve_requests_total" in response.read()
        # The gRPC port serves no /metrics (HTTP/1.1 gets HTTP/2 frames back).
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://{server.address}/metrics", timeout=10).read()
        wrong_port = Client(f"127.0.0.1:{server.server.metrics_port}", timeout=10)
        with pytest.raises(grpc.RpcError):  # and the metrics port speaks no gRPC
            wrong_port.info()
        wrong_port.close()
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], metrics_port=-1) as server:
        assert server.server.metrics_port is None
        with Client(server.address, timeout=30) as client:
            assert client.health() == "SERVING"
