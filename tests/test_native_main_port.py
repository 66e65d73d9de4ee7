"""`grpc_transport native`: the main port served by the native transport (service/grpc/native/), every method
there (unary calls in C++, streams relayed to grpc.aio), with one process and with 2 fronts."""

from __future__ import annotations

import concurrent.futures

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from bertserve.client import Client
from bertserve.service.errors import StartupError
from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc as pb_grpc
from tests.helpers import triton_client as triton
from tests.helpers.server import GatedBatches, ServerProcess, ServerThread, wait_for
from tests.test_server_tls import pki  # noqa: F401 (the certificates fixture)
from tests.test_workers import assert_each_front_answers_a_share

MODEL = "tiny-embed"
TEXTS = ["the cat sat", "a longer sentence about dogs and cats and birds", "x"]


@pytest.fixture(scope="module")
def native(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=[MODEL], grpc_transport="native") as running:
        yield running


@pytest.fixture(scope="module")
def python(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=[MODEL]) as running:
        yield running


def test_the_clients_calls_equal_the_python_transports(native, python):
    answers = []
    for server in (native, python):
        with Client(f"127.0.0.1:{server.server.port}", timeout=30) as client:
            answers.append((client.embed(TEXTS, model=MODEL).vectors, client.info().models[0].name))
    assert np.abs(answers[0][0] - answers[1][0]).max() <= 1e-5 and answers[0][1] == answers[1][1] == MODEL
    assert native.server.native is not None and native.server.native_port is None


def test_streams_health_and_reflection(native):
    with grpc.insecure_channel(f"127.0.0.1:{native.server.port}") as channel:
        requests = [pb.EmbedStreamRequest(id=i, inputs=[text]) for i, text in enumerate(TEXTS)]
        answers = list(pb_grpc.InferenceStub(channel).EmbedStream(iter(requests), timeout=30))
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert sorted(a.id for a in answers) == [0, 1, 2] and all(a.result.embeddings for a in answers)
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    assert "bertserve.v1.Inference" in services


def test_kserve_with_tritons_client(native):
    texts = np.array([t.encode() for t in TEXTS], dtype=object)
    with triton.child() as child:
        answer = child.submit(triton.infer, f"127.0.0.1:{native.server.port}", MODEL, texts).result(60)
    assert answer["outputs"]["embedding"].shape[0] == len(TEXTS)


def test_with_native_port_too_the_start_fails_naming_it(tiny_repo):
    with pytest.raises(ValueError, match="native_port: with grpc_transport native"):
        ServerThread(model_repo=tiny_repo, models=[MODEL], grpc_transport="native", native_port=0).start()


def test_a_taken_port_fails_at_start(tiny_repo, native):
    taken = ServerThread(
        model_repo=tiny_repo, models=[MODEL], grpc_transport="native", port=native.server.port
    )
    with pytest.raises(StartupError, match="setting port: cannot listen on"):
        taken.start()


def test_tls(tiny_repo, pki):  # noqa: F811
    settings = dict(tls_cert=pki / "server.pem", tls_key=pki / "server-key.pem")
    with ServerThread(model_repo=tiny_repo, models=[MODEL], grpc_transport="native", **settings) as server:
        credentials = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{server.server.port}", credentials) as channel:
            stub = pb_grpc.InferenceStub(channel)
            answer = stub.Embed(pb.EmbedRequest(inputs=TEXTS), timeout=30)
            stream = list(stub.EmbedStream(iter([pb.EmbedStreamRequest(inputs=["a"])]), timeout=30))
    assert len(answer.embeddings) == len(TEXTS) and stream[0].result.embeddings


def test_drain(tiny_repo):
    """As on grpc.aio: a call in flight is answered, a new one refused, health answers NOT_SERVING."""
    with ServerThread(
        model_repo=tiny_repo, models=[MODEL], grpc_transport="native", grace_period_s=30
    ) as server:
        model = server.server.core.registry.by_name[MODEL]
        with (
            grpc.insecure_channel(f"127.0.0.1:{server.server.port}") as channel,
            GatedBatches(model) as gate,
            concurrent.futures.ThreadPoolExecutor(1) as pool,
        ):
            stub = pb_grpc.InferenceStub(channel)
            held = stub.Embed.future(pb.EmbedRequest(inputs=["held"]), timeout=60)
            assert gate.computing.wait(30)
            drained = pool.submit(server.call, server.server.drain)
            wait_for(lambda: not server.server.lifecycle.accepting)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Embed(pb.EmbedRequest(inputs=["late"]), timeout=10)
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            gate.release()
            assert len(held.result(30).embeddings) == 1
            assert drained.result(60) is True
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_two_fronts(tiny_repo):
    server = ServerProcess(
        "--model-repo", str(tiny_repo), "--model", MODEL, "--workers", "2", "--grpc-transport", "native",
    ).start(timeout=120)  # fmt: skip
    try:
        address = f"127.0.0.1:{server.port}"
        assert_each_front_answers_a_share(server, address)
        with grpc.insecure_channel(address) as channel:
            requests = [pb.EmbedStreamRequest(id=i, inputs=[text]) for i, text in enumerate(TEXTS)]
            answers = list(pb_grpc.InferenceStub(channel).EmbedStream(iter(requests), timeout=30))
        assert sorted(a.id for a in answers) == [0, 1, 2]
        wait_for(lambda: server.process.poll() is None)
    finally:
        server.kill()
