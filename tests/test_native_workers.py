"""The native port with `workers` 2: each front serves it beside its gRPC and HTTP ports, sharing the port
the supervisor holds, and sends its calls' inputs to the one engine, which batches them with every other
front's."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc as pb_grpc
from tests.helpers.server import ServerProcess, metric, scrape, wait_for
from tests.test_native_front import _code, _embed
from tests.test_workers import assert_each_front_answers_a_share

MODEL = "tiny-embed"
TEXTS = ["the cat sat", "a longer sentence about dogs and cats and birds", "x"]


@pytest.fixture(scope="module")
def native_fronts(tiny_repo):
    server = ServerProcess(
        "--model-repo", str(tiny_repo), "--model", MODEL, "--workers", "2", "--native-port", "0",
    ).start(timeout=120)  # fmt: skip
    yield server
    server.kill()


def test_answers_equal_the_main_ports(native_fronts):
    for request in (pb.EmbedRequest(inputs=TEXTS), pb.EmbedRequest(inputs=TEXTS[:1], normalize=False)):
        got = _embed(native_fronts.native_port, request)
        want = _embed(native_fronts.port, request)
        assert got.dimension == want.dimension > 0
        values = np.array([e.values for e in got.embeddings])
        assert np.abs(values - np.array([e.values for e in want.embeddings])).max() <= 1e-5


def test_calls_beyond_plain_embed_reach_the_engine_through_the_fronts(native_fronts):
    """Embed with options and Tokenize on the native port, answered by the fronts' main-port handlers."""
    request = pb.EmbedRequest(inputs=TEXTS, options=pb.EmbedOptions(tokens=True, dense=True))
    got, want = (_embed(port, request) for port in (native_fronts.native_port, native_fronts.port))
    for one, other in zip(got.embeddings, want.embeddings, strict=True):
        assert np.abs(np.array(one.tokens.values) - np.array(other.tokens.values)).max() <= 1e-5
    with grpc.insecure_channel(f"127.0.0.1:{native_fronts.native_port}") as channel:
        tokens = pb_grpc.InferenceStub(channel).Tokenize(pb.TokenizeRequest(inputs=TEXTS), timeout=30)
    assert [len(r.tokens) for r in tokens.results] == [e.tokens.count for e in got.embeddings]


def test_streams_are_relayed_to_the_fronts_grpc_servers(native_fronts):
    requests = [pb.EmbedStreamRequest(id=i, inputs=[text]) for i, text in enumerate(TEXTS)]
    with grpc.insecure_channel(f"127.0.0.1:{native_fronts.native_port}") as channel:
        answers = list(pb_grpc.InferenceStub(channel).EmbedStream(iter(requests), timeout=30))
    assert sorted(a.id for a in answers) == list(range(len(TEXTS)))
    assert all(len(a.result.embeddings) == 1 for a in answers)


def test_refusals_are_the_main_ports(native_fronts):
    request = pb.EmbedRequest(inputs=TEXTS, model="no-such-model")
    code, details = _code(native_fronts.native_port, request)
    assert (code, details) == _code(native_fronts.port, request)
    assert code == grpc.StatusCode.NOT_FOUND


def test_connections_reach_both_fronts_native_port(native_fronts):
    """SO_REUSEPORT among the server's own fronts spreads the native port's connections too."""
    assert_each_front_answers_a_share(native_fronts, f"127.0.0.1:{native_fronts.native_port}")


def test_one_scrape_counts_native_calls_of_every_front(native_fronts):
    def ok() -> float:
        return metric(scrape(native_fronts.metrics_url), "bertserve_requests_total", rpc="Embed", code="OK")

    before = ok()
    for _ in range(20):
        _embed(native_fronts.native_port, pb.EmbedRequest(inputs=TEXTS[:1]))
    wait_for(lambda: ok() - before >= 20, timeout=10)
    assert ok() - before == 20


def test_a_second_server_on_the_taken_native_port_fails_at_start(native_fronts, tiny_repo):
    port = native_fronts.native_port
    for workers in ("1", "2"):
        second = ServerProcess(
            "--model-repo", str(tiny_repo), "--model", MODEL, "--native-port", str(port), "--workers", workers,
        )  # fmt: skip
        assert second.run_to_exit() == 1
        assert "setting native_port: cannot listen on" in second.output, second.output
        assert "Traceback" not in second.output
    assert len(_embed(port, pb.EmbedRequest(inputs=TEXTS)).embeddings) == len(TEXTS)  # still served
