"""TLS and mutual TLS from certificate files (made here with `cryptography`); plaintext is refused."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import urllib.request

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bertserve.client import Client
from tests.helpers.server import ServerProcess, ServerThread


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, key, issuer_name: x509.Name, issuer_key, is_ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if not is_ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    directory = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("test-ca", ca_key, _name("test-ca"), ca_key, is_ca=True)
    files = {"ca.pem": ca.public_bytes(serialization.Encoding.PEM)}
    for who in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        files[f"{who}.pem"] = _certificate(who, key, ca.subject, ca_key, is_ca=False).public_bytes(
            serialization.Encoding.PEM
        )
        files[f"{who}-key.pem"] = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


@pytest.fixture
def tls_server_settings(tiny_repo, pki) -> dict:
    """A tiny-embed server's settings with the test CA's server certificate (add tls_client_ca for mutual TLS)."""
    return dict(
        model_repo=tiny_repo,
        models=["tiny-embed"],
        tls_cert=pki / "server.pem",
        tls_key=pki / "server-key.pem",
    )


def _refused(client: Client) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failure:
        client.info(timeout=5)
    return failure.value.code()


def test_tls_and_mutual_tls(tls_server_settings, pki):
    ca = (pki / "ca.pem").read_bytes()
    common = tls_server_settings
    with ServerThread(**common) as server:
        with Client(server.address, credentials=grpc.ssl_channel_credentials(ca)) as client:
            assert client.info().models[0].name == "tiny-embed"
        with Client(server.address) as plaintext:
            assert _refused(plaintext) is grpc.StatusCode.UNAVAILABLE

    with ServerThread(**common, tls_client_ca=pki / "ca.pem") as server:
        anonymous = grpc.ssl_channel_credentials(ca)
        with Client(server.address, credentials=anonymous) as client:
            assert _refused(client) is grpc.StatusCode.UNAVAILABLE
        identified = grpc.ssl_channel_credentials(
            ca, (pki / "client-key.pem").read_bytes(), (pki / "client.pem").read_bytes()
        )
        with Client(server.address, credentials=identified) as client:
            assert len(client.embed(["a cat"]).vectors) == 1


def test_tls_with_two_workers(tiny_repo, pki):
    """Each front serves TLS on the shared ports: gRPC and HTTPS answer through either."""
    server = ServerProcess(
        "--model-repo", str(tiny_repo), "--model", "tiny-embed", "--workers", "2",
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server-key.pem"),
    ).start(timeout=120)  # fmt: skip
    try:
        credentials = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
        for _ in range(6):  # a connection each: both fronts
            with Client(server.address, credentials=credentials) as client:
                assert len(client.embed(["a cat"]).vectors) == 1
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        body = json.dumps({"input": "a cat"}).encode()
        url = f"https://127.0.0.1:{server.http_port}/v1/embeddings"
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            assert len(json.load(response)["data"][0]["embedding"]) == 48
    finally:
        server.kill()
