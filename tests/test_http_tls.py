"""HTTPS: with TLS configured the HTTP port speaks TLS with the gRPC port's certificate (and requires
client certificates with tls_client_ca); plaintext HTTP to it gets no answer."""

from __future__ import annotations

import ssl

import httpx
import pytest

from tests.helpers.server import ServerThread
from tests.test_server_tls import pki, tls_server_settings  # noqa: F401  (the certificates and settings fixtures)


def test_https_uses_the_tls_settings(tls_server_settings, pki):  # noqa: F811
    trust = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    common = tls_server_settings
    with ServerThread(**common) as server:
        url = f"https://127.0.0.1:{server.server.http_port}"
        assert server.server.http.scheme == "https"
        assert httpx.get(f"{url}/health", verify=trust, timeout=10).status_code == 200
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{server.server.http_port}/health", timeout=10)
    with ServerThread(**common, tls_client_ca=pki / "ca.pem") as server:
        url = f"https://127.0.0.1:{server.server.http_port}"
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", verify=trust, timeout=10)  # no client certificate
        identified = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        identified.load_cert_chain(pki / "client.pem", pki / "client-key.pem")
        reply = httpx.post(f"{url}/v1/embeddings", json={"input": "a cat"}, verify=identified, timeout=30)
        assert reply.status_code == 200 and len(reply.json()["data"][0]["embedding"]) == 48
