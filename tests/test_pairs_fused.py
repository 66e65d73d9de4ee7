"""A cross-encoder whose score adds an embedding model's cosine (manifest `cross_encoder.fusion`), as the
default reranker serves it: exported with `export_model(fusion=...)`, served over gRPC and HTTP beside its
embedding model, each score equal to activation(logit_weight * logit + cosine_weight * cosine + bias) with
the logit from transformers and the cosine from the server's own Score on the embedding model, within 1e-4.
"""

from __future__ import annotations

import shutil

import grpc
import httpx
import numpy as np
import pytest
import torch

from bertserve.export.errors import ExportError
from bertserve.export.pipeline import export_model
from bertserve.repository import CosineFusion
from bertserve.service.errors import StartupError
from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc as pb_grpc
from tests.helpers.server import ServerThread
from tests.pair_models import PAIR_EMBED

FUSED = "tiny-fused-reranker"
SELF_FUSED = "tiny-self-fused"
FUSION = CosineFusion(embedding_model=PAIR_EMBED, cosine_weight=1.5, logit_weight=0.7, bias=-0.2)
TOL = 1e-4
QUERY = "where is the cat"
DOCS = ["the cat sat on the mat", "paris is the capital", "a dog", "the mat is in paris", "cat and dog"]
FIRSTS = ["the cat sat on the mat", "a dog", "paris is the capital"]
SECONDS = ["a cat is on a mat", "the dog sat", "capital of paris"]


@pytest.fixture(scope="module")
def repo(pair_repo, tiny_cross_encoder, tmp_path_factory):
    repo = tmp_path_factory.mktemp("fused") / "repo"
    shutil.copytree(pair_repo, repo)
    export_model(
        tiny_cross_encoder.checkpoint, repo, name=FUSED, version=1, fusion=FUSION, log=lambda _: None
    )
    # the same cross-encoder adding its own embeddings' cosine: both runs in one encoder's queue
    self_fusion = FUSION.model_copy(update={"embedding_model": "tiny-cross-encoder"})
    export_model(
        tiny_cross_encoder.checkpoint,
        repo,
        name=SELF_FUSED,
        version=1,
        fusion=self_fusion,
        log=lambda _: None,
    )
    return repo


@pytest.fixture(scope="module")
def server(repo):
    with ServerThread(model_repo=repo, max_queue_delay_ms=5) as server:
        yield server


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.InferenceStub(channel)


def logits(model, firsts, seconds, truncation) -> np.ndarray:
    batch = model.encode_pairs(firsts, seconds, truncation)
    with torch.no_grad():
        out = model.transformers_model()(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits
    return out[:, 0].numpy()


def cosines(stub, firsts, seconds) -> np.ndarray:
    response = stub.Score(pb.ScoreRequest(texts_1=firsts, texts_2=seconds, model=PAIR_EMBED), timeout=30)
    assert response.method == "cosine"
    return np.array([r.score for r in response.results])


def fused(logit: np.ndarray, cosine: np.ndarray) -> np.ndarray:
    return FUSION.logit_weight * logit + FUSION.cosine_weight * cosine + FUSION.bias


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def test_manifest_records_the_fusion(repo):
    from bertserve.repository import read_manifest

    assert read_manifest(repo / FUSED / "1").tasks.classify.cross_encoder.fusion == FUSION


def test_rerank_adds_the_cosine_to_the_logit(stub, tiny_cross_encoder):
    linear = fused(
        logits(tiny_cross_encoder, [QUERY] * len(DOCS), DOCS, "only_second"), cosines(stub, [QUERY], DOCS)
    )
    for raw, expected in ((False, sigmoid(linear)), (True, linear)):
        response = stub.Rerank(
            pb.RerankRequest(query=QUERY, documents=DOCS, model=FUSED, raw_scores=raw), timeout=30
        )
        assert response.method == "cross_encoder+cosine"
        got = np.array([r.score for r in response.results])
        np.testing.assert_allclose(got, expected[[r.index for r in response.results]], atol=TOL)
        assert sorted(r.index for r in response.results) == list(range(len(DOCS)))
        assert all(got[i] >= got[i + 1] for i in range(len(got) - 1))
    # each document's tokens: its pair in the cross-encoder plus its own text in the embedding model
    tokens = list(response.metadata.input_tokens)
    assert len(tokens) == len(DOCS) and all(t > 0 for t in tokens)
    plain = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS, model=PAIR_EMBED), timeout=30)
    assert all(t > c for t, c in zip(tokens, plain.metadata.input_tokens, strict=True))


def test_score_one_to_many_and_pairwise(stub, tiny_cross_encoder):
    for firsts in ([QUERY], FIRSTS):
        seconds = DOCS[: len(FIRSTS)] if len(firsts) > 1 else DOCS
        pair_firsts = firsts * len(seconds) if len(firsts) == 1 else firsts
        expected = sigmoid(
            fused(
                logits(tiny_cross_encoder, pair_firsts, seconds, "longest_first"),
                cosines(stub, firsts, seconds),
            )
        )
        response = stub.Score(pb.ScoreRequest(texts_1=firsts, texts_2=seconds, model=FUSED), timeout=30)
        assert response.method == "cross_encoder+cosine"
        np.testing.assert_allclose([r.score for r in response.results], expected, atol=TOL)


def test_http_rerank_gives_the_fused_score(server, stub):
    grpc_scores = {
        r.index: r.score
        for r in stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS, model=FUSED), timeout=30).results
    }
    body = {"model": FUSED, "query": QUERY, "documents": DOCS, "top_n": 2}
    reply = httpx.post(f"{server.http_url}/v2/rerank", json=body, timeout=60)
    assert reply.status_code == 200, reply.text[:300]
    results = reply.json()["results"]
    assert [r["index"] for r in results] == sorted(grpc_scores, key=lambda i: -grpc_scores[i])[:2]
    for r in results:
        assert abs(r["relevance_score"] - grpc_scores[r["index"]]) <= TOL


def test_a_client_token_limit_must_cover_both_models_cuts(server, repo):
    """Cohere's max_tokens_per_doc below the embedding model's max_length is refused: the cosine side would
    read more of each document than the client allowed."""
    from bertserve.repository import read_manifest

    cross, embed = (read_manifest(repo / name / "1").max_length for name in (FUSED, PAIR_EMBED))
    assert cross < embed  # the tiny cross-encoder's own max_length, the embedding model's positions
    body = {"model": FUSED, "query": QUERY, "documents": DOCS}
    reply = httpx.post(f"{server.http_url}/v2/rerank", json=body | {"max_tokens_per_doc": cross}, timeout=60)
    assert reply.status_code == 400, reply.text[:300]
    assert f"model {PAIR_EMBED}'s max_length {embed}" in reply.text
    reply = httpx.post(f"{server.http_url}/v2/rerank", json=body | {"max_tokens_per_doc": embed}, timeout=60)
    assert reply.status_code == 200, reply.text[:300]


def test_info_names_the_embedding_model_a_reranker_adds(server, capsys):
    """Info (gRPC, the client library, `bertserve info` and HTTP) says which model's cosine a fused
    cross-encoder adds."""
    from bertserve.cli import main
    from bertserve.client import Client

    with Client(server.address) as client:
        info = {m.name: m for m in client.info().models}
    assert info[FUSED].cosine_of == PAIR_EMBED and info[FUSED].cross_encoder
    assert info["tiny-cross-encoder"].cosine_of == "" and info[PAIR_EMBED].cosine_of == ""
    assert main(["info", "--address", server.address]) == 0
    assert f"reranks with {PAIR_EMBED}'s cosine added" in capsys.readouterr().out
    reply = httpx.get(f"{server.http_url}/bertserve/v1/info", timeout=30).json()
    assert {m["name"]: m["cosine_of"] for m in reply["models"]}[FUSED] == PAIR_EMBED


def test_default_reranker_is_the_first_cross_encoder_and_reports_its_method(repo):
    with (
        ServerThread(model_repo=repo, models=[PAIR_EMBED, FUSED]) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        response = pb_grpc.InferenceStub(channel).Rerank(
            pb.RerankRequest(query=QUERY, documents=DOCS), timeout=30
        )
        assert response.method == "cross_encoder+cosine" and response.metadata.model == FUSED


def test_server_refuses_to_start_without_the_embedding_model(repo):
    with pytest.raises(StartupError, match=f"cosine of embedding model '{PAIR_EMBED}', which is not served"):
        ServerThread(model_repo=repo, models=[FUSED]).start()


def test_texts_over_the_embedding_queue_are_refused_before_any_work(repo):
    """Rerank of n documents embeds n + 1 texts: over max_queue_inputs it is refused as the cosine is."""
    n = len(DOCS)
    settings = dict(model_repo=repo, max_queue_inputs=n, max_inputs_per_request=n, max_queue_delay_ms=5)
    with ServerThread(**settings) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        assert (
            len(
                stub.Rerank(
                    pb.RerankRequest(query=QUERY, documents=DOCS, model="tiny-cross-encoder"), timeout=30
                ).results
            )
            == n
        )
        with pytest.raises(grpc.RpcError) as error:
            stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS, model=FUSED), timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (
            f"documents: these pairs need {n + 1} texts embedded, more than max_queue_inputs {n}"
            in error.value.details()
        )
        assert (
            len(
                stub.Rerank(
                    pb.RerankRequest(query=QUERY, documents=DOCS[:-1], model=FUSED), timeout=30
                ).results
            )
            == n - 1
        )


def test_pairs_and_texts_in_one_queue_are_counted_together(repo):
    """A fusion whose embedding model runs on the cross-encoder's own encoder puts the N pairs and the N + 1
    texts in one queue: over max_queue_inputs together, refused as the client's mistake (not a retry)."""
    n = len(DOCS)
    settings = dict(model_repo=repo, max_queue_inputs=2 * n, max_inputs_per_request=n, max_queue_delay_ms=5)
    with ServerThread(**settings) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS, model=SELF_FUSED), timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        expected = (
            f"need {2 * n + 1} texts embedded and pairs, in one queue, more than max_queue_inputs {2 * n}"
        )
        assert expected in error.value.details()
        response = stub.Rerank(
            pb.RerankRequest(query=QUERY, documents=DOCS[:-1], model=SELF_FUSED), timeout=30
        )
        assert response.method == "cross_encoder+cosine" and len(response.results) == n - 1


def test_a_fusion_that_cannot_add_up_is_refused(repo, tmp_path):
    """Weights must be finite (the manifest's schema); softmax over one label is always 1, which would drop
    the sum: the server refuses to start on such a manifest."""
    import json

    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        CosineFusion(embedding_model=PAIR_EMBED, cosine_weight=float("nan"), logit_weight=1.0)
    broken = tmp_path / "repo"
    shutil.copytree(repo, broken)
    path = broken / FUSED / "1" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["tasks"]["classify"]["cross_encoder"]["activation"] = "softmax"
    path.write_text(json.dumps(manifest))
    with pytest.raises(StartupError, match="a cosine fusion needs a sigmoid or identity activation"):
        ServerThread(model_repo=broken, models=[PAIR_EMBED, FUSED]).start()


def test_export_refuses_a_fusion_it_cannot_serve(
    pair_repo, tiny_cross_encoder, tiny_pair_classifier, tmp_path
):
    with pytest.raises(ExportError, match=f"embedding model '{PAIR_EMBED}' is not in"):
        export_model(tiny_cross_encoder.checkpoint, tmp_path, name="x", fusion=FUSION, log=lambda _: None)
    with pytest.raises(ExportError, match="needs a cross-encoder of one score"):
        export_model(tiny_pair_classifier.checkpoint, tmp_path, name="y", fusion=FUSION, log=lambda _: None)


def test_fronts_of_several_processes_serve_the_fused_score(repo, stub):
    """`serve --workers 2`: each front computes the sum from the engine's logits and cosines."""
    from tests.helpers.server import ServerProcess

    request = pb.RerankRequest(query=QUERY, documents=DOCS, model=FUSED)
    expected = {r.index: r.score for r in stub.Rerank(request, timeout=30).results}
    server = ServerProcess("--model-repo", str(repo), "--workers", "2").start(timeout=180)
    try:
        for _ in range(4):  # each a new connection, which the kernel gives to either front
            with grpc.insecure_channel(server.address) as channel:
                response = pb_grpc.InferenceStub(channel).Rerank(request, timeout=60)
            assert response.method == "cross_encoder+cosine"
            for r in response.results:
                assert abs(r.score - expected[r.index]) <= TOL
    finally:
        assert server.terminate() == 0
