"""Sentence pairs over gRPC bertserve.v1 on real exported graphs: Classify with pairs, Rerank and Score.

The models of tests/helpers/pair_grpc.py are served on 127.0.0.1. Answers are compared within 1e-4 with
transformers' logits, with `CrossEncoder.predict`, and (cosine) with the server's own normalized embeddings.
Refusals are in tests/test_pairs_grpc_errors.py.
"""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import torch

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc as pb_grpc
from tests.helpers.pair_grpc import (
    CROSS_ENCODER,
    DOCUMENTS,
    EMBED,
    FIRSTS,
    LONG,
    MAX_INPUTS,
    PAIR_CLASSIFIER,
    QUERY,
    SECONDS,
    TOL,
    Models,
)
from tests.helpers.server import ServerProcess, ServerThread, metric, scrape


@pytest.fixture(scope="module")
def models(grpc_pair_models) -> Models:
    return grpc_pair_models


@pytest.fixture(scope="module")
def server(models):
    with ServerThread(model_repo=models.repo, max_queue_delay_ms=5, max_inputs_per_request=MAX_INPUTS) as s:
        yield s


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.InferenceStub(channel)


def max_length_of(stub, name: str) -> int:
    return next(m.max_length for m in stub.Info(pb.InfoRequest(), timeout=30).models if m.name == name)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def by_index(classification) -> np.ndarray:
    return np.array([s.score for s in sorted(classification.labels, key=lambda s: s.index)])


# --- Classify with pairs ------------------------------------------------------------------------------


def test_classify_pairs_equal_transformers(stub, models):
    logits = models.logits(models.classifier, FIRSTS, SECONDS)
    response = stub.Classify(
        pb.ClassifyRequest(inputs=FIRSTS, pairs=SECONDS, model=PAIR_CLASSIFIER), timeout=30
    )
    got = np.stack([by_index(r) for r in response.results])
    np.testing.assert_allclose(got, softmax(logits), atol=TOL)
    raw = stub.Classify(
        pb.ClassifyRequest(inputs=FIRSTS, pairs=SECONDS, model=PAIR_CLASSIFIER, raw_scores=True), timeout=30
    )
    np.testing.assert_allclose(np.stack([by_index(r) for r in raw.results]), logits, atol=TOL)
    singles = stub.Classify(
        pb.ClassifyRequest(inputs=FIRSTS, model=PAIR_CLASSIFIER, raw_scores=True), timeout=30
    )
    assert not np.allclose(np.stack([by_index(r) for r in singles.results]), logits, atol=TOL), "pairs matter"
    assert list(response.metadata.input_tokens) == [
        len(ids) for ids in models.tokenizer(FIRSTS, SECONDS)["input_ids"]
    ]


@pytest.mark.parametrize("strategy", ["longest_first", "only_first", "only_second", ""])
def test_classify_pairs_truncated_as_transformers(stub, models, strategy):
    max_length = max_length_of(stub, PAIR_CLASSIFIER)
    firsts, seconds = [LONG, "the cat", LONG], [LONG + " a dog", LONG, "the dog"]
    if strategy == "only_first":  # the second text must fit whole beside the first's cut
        firsts, seconds = [LONG, "a dog " + LONG], ["the dog", "a cat sat"]
    elif strategy == "only_second":
        firsts, seconds = ["the cat", "a dog sat"], [LONG, "a dog " + LONG]
    request = pb.ClassifyRequest(
        inputs=firsts, pairs=seconds, model=PAIR_CLASSIFIER, raw_scores=True, truncate=True,
        truncation_strategy=strategy,
    )  # fmt: skip
    response = stub.Classify(request, timeout=30)
    expected = models.logits(models.classifier, firsts, seconds, strategy or "longest_first", max_length)
    np.testing.assert_allclose(np.stack([by_index(r) for r in response.results]), expected, atol=TOL)
    assert list(response.metadata.truncated) == [True] * len(firsts)
    assert list(response.metadata.input_tokens) == [max_length] * len(firsts)


def test_classify_default_skips_the_cross_encoder_which_scores_its_one_label(stub, models):
    """The first model in order is the cross-encoder; Classify's default is the 3-label classifier."""
    (default,) = stub.Classify(pb.ClassifyRequest(inputs=["a cat"], pairs=["a dog"]), timeout=30).results
    assert len(default.labels) == 3
    response = stub.Classify(
        pb.ClassifyRequest(inputs=FIRSTS, pairs=SECONDS, model=CROSS_ENCODER), timeout=30
    )
    expected = models.cross_encoder.predict(list(zip(FIRSTS, SECONDS, strict=True)))
    np.testing.assert_allclose([r.labels[0].score for r in response.results], expected, atol=TOL)


# --- Rerank ---------------------------------------------------------------------------------------------


def test_rerank_equals_cross_encoder_predict(stub, models):
    expected = models.cross_encoder.predict([(QUERY, d) for d in DOCUMENTS])
    response = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS), timeout=30)
    assert response.method == "cross_encoder" and response.metadata.model == CROSS_ENCODER
    order = sorted(range(len(DOCUMENTS)), key=lambda i: (-expected[i], i))
    assert [r.index for r in response.results] == order
    np.testing.assert_allclose([r.score for r in response.results], expected[order], atol=TOL)
    assert all(r.document == "" and not r.truncated for r in response.results)
    # the duplicate document ties: the lower index first
    twins = [r.index for r in response.results if DOCUMENTS[r.index] == "the cat"]
    assert twins == [2, 4]
    # metadata per document, in request order
    pairs = models.tokenizer([QUERY] * len(DOCUMENTS), DOCUMENTS)["input_ids"]
    assert list(response.metadata.input_tokens) == [len(ids) for ids in pairs]

    top = stub.Rerank(
        pb.RerankRequest(query=QUERY, documents=DOCUMENTS, top_n=2, return_documents=True), timeout=30
    )
    assert [(r.index, r.document) for r in top.results] == [(i, DOCUMENTS[i]) for i in order[:2]]
    more = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS, top_n=99), timeout=30)
    assert [r.index for r in more.results] == order

    raw = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS, raw_scores=True), timeout=30)
    logits = models.cross_encoder.predict([(QUERY, d) for d in DOCUMENTS], activation_fn=torch.nn.Identity())
    np.testing.assert_allclose([r.score for r in raw.results], logits[order], atol=TOL)


def test_rerank_cuts_documents_only(stub, models):
    max_length = max_length_of(stub, CROSS_ENCODER)
    documents = ["the cat", LONG, "a dog " + LONG]
    response = stub.Rerank(pb.RerankRequest(query=QUERY, documents=documents, raw_scores=True), timeout=30)
    logits = models.logits(
        models.cross_encoder_logits_model, [QUERY] * 3, documents, "only_second", max_length
    )[:, 0]
    got = {r.index: (r.score, r.truncated) for r in response.results}
    np.testing.assert_allclose([got[i][0] for i in range(3)], logits, atol=TOL)
    assert [got[i][1] for i in range(3)] == [False, True, True]
    assert list(response.metadata.truncated) == [False, True, True]
    refused = pb.RerankRequest(query=QUERY, documents=documents, truncate=False)
    with pytest.raises(grpc.RpcError) as info:
        stub.Rerank(refused, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        info.value.details().startswith("documents[1]: ")
        and f"max_length {max_length}" in info.value.details()
    )


def test_rerank_and_score_by_cosine_equal_the_embeddings(stub):
    def vectors(texts):
        response = stub.Embed(pb.EmbedRequest(inputs=texts, model=EMBED, normalize=True), timeout=30)
        return np.array([e.values for e in response.embeddings])

    q, docs = vectors([QUERY])[0], vectors(DOCUMENTS)
    expected = docs @ q
    response = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS, model=EMBED), timeout=30)
    assert response.method == "cosine"
    np.testing.assert_allclose(
        [r.score for r in sorted(response.results, key=lambda r: r.index)], expected, atol=TOL
    )
    assert [r.index for r in response.results] == sorted(range(5), key=lambda i: (-expected[i], i))
    pairwise = stub.Score(pb.ScoreRequest(texts_1=FIRSTS, texts_2=SECONDS, model=EMBED), timeout=30)
    assert pairwise.method == "cosine"
    expected = np.sum(vectors(FIRSTS) * vectors(SECONDS), axis=1)
    np.testing.assert_allclose([r.score for r in pairwise.results], expected, atol=TOL)


def test_cosine_rerank_embeds_the_query_once(stub, server):
    before = scrape(server.metrics_url)
    stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS, model=EMBED), timeout=30)
    after = scrape(server.metrics_url)
    moved = metric(after, "bertserve_inputs_total", model=EMBED, task="embed") - metric(
        before, "bertserve_inputs_total", model=EMBED, task="embed"
    )
    assert moved == len(DOCUMENTS) + 1
    answered = metric(after, "bertserve_requests_total", rpc="Rerank", code="OK") - metric(
        before, "bertserve_requests_total", rpc="Rerank", code="OK"
    )
    assert answered == 1  # counted under its own RPC name


# --- Score ----------------------------------------------------------------------------------------------


def test_score_equals_cross_encoder_predict(stub, models):
    pairs = list(zip(FIRSTS, SECONDS, strict=True))
    response = stub.Score(pb.ScoreRequest(texts_1=FIRSTS, texts_2=SECONDS), timeout=30)
    assert response.method == "cross_encoder"
    np.testing.assert_allclose(
        [r.score for r in response.results], models.cross_encoder.predict(pairs), atol=TOL
    )
    one = stub.Score(pb.ScoreRequest(texts_1=[QUERY], texts_2=DOCUMENTS, model=CROSS_ENCODER), timeout=30)
    expected = models.cross_encoder.predict([(QUERY, d) for d in DOCUMENTS])
    np.testing.assert_allclose([r.score for r in one.results], expected, atol=TOL)
    max_length = max_length_of(stub, CROSS_ENCODER)
    cut = stub.Score(
        pb.ScoreRequest(texts_1=[LONG, "a cat"], texts_2=["the dog", LONG], truncate=True, raw_scores=True),
        timeout=30,
    )
    logits = models.logits(
        models.cross_encoder_logits_model, [LONG, "a cat"], ["the dog", LONG], "longest_first", max_length
    )[:, 0]
    np.testing.assert_allclose([r.score for r in cut.results], logits, atol=TOL)
    assert [r.truncated for r in cut.results] == [True, True]


# --- information and defaults ---------------------------------------------------------------------------


def test_info_names_pair_models_and_defaults(stub):
    info = {m.name: m for m in stub.Info(pb.InfoRequest(), timeout=30).models}
    assert info[CROSS_ENCODER].cross_encoder and not info[PAIR_CLASSIFIER].cross_encoder
    assert not info[EMBED].cross_encoder
    assert {"Rerank", "Score"} <= set(info[CROSS_ENCODER].default_for)
    assert "Classify" in info[PAIR_CLASSIFIER].default_for
    assert "Classify" not in info[CROSS_ENCODER].default_for


def test_without_a_cross_encoder_the_default_is_the_embedding_model(models):
    settings = dict(model_repo=models.repo, models=[EMBED, PAIR_CLASSIFIER], max_queue_delay_ms=5)
    with ServerThread(**settings) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        response = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS), timeout=30)
        assert (response.method, response.metadata.model) == ("cosine", EMBED)
        info = {m.name: m for m in stub.Info(pb.InfoRequest(), timeout=30).models}
        assert {"Rerank", "Score"} <= set(info[EMBED].default_for)


def test_a_classifier_of_several_labels_is_never_the_cosine_default(models):
    """Exported classifiers carry an embed task too; Rerank refuses one of 3 labels by name, so the
    default passes it by for the embedding model after it."""
    settings = dict(model_repo=models.repo, models=[PAIR_CLASSIFIER, EMBED], max_queue_delay_ms=5)
    with ServerThread(**settings) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        response = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS), timeout=30)
        assert (response.method, response.metadata.model) == ("cosine", EMBED)
        scored = stub.Score(pb.ScoreRequest(texts_1=[QUERY], texts_2=DOCUMENTS), timeout=30)
        assert (scored.method, scored.metadata.model) == ("cosine", EMBED)


def test_a_one_label_regression_model_answers_its_raw_value(models, tmp_path):
    """A one-label model exported as regression (no CrossEncoder config) keeps answering Classify with
    the raw value, as before pairs; Rerank and Score give the same scores."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(models.repo / CROSS_ENCODER, repo / CROSS_ENCODER)
    manifest_path = repo / CROSS_ENCODER / "1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["tasks"]["classify"].update(cross_encoder=None, problem_type="regression")
    manifest_path.write_text(json.dumps(manifest))
    logits = models.cross_encoder.predict([(QUERY, d) for d in DOCUMENTS], activation_fn=torch.nn.Identity())
    with (
        ServerThread(model_repo=repo, max_queue_delay_ms=5) as server,
        grpc.insecure_channel(server.address) as ch,
    ):
        stub = pb_grpc.InferenceStub(ch)
        classified = stub.Classify(pb.ClassifyRequest(inputs=[QUERY] * 5, pairs=DOCUMENTS), timeout=30)
        np.testing.assert_allclose([r.labels[0].score for r in classified.results], logits, atol=TOL)
        scored = stub.Score(pb.ScoreRequest(texts_1=[QUERY], texts_2=DOCUMENTS), timeout=30)
        np.testing.assert_allclose([r.score for r in scored.results], logits, atol=TOL)


# --- several processes ----------------------------------------------------------------------------------


def test_rerank_with_two_workers_equals_one_process(models, stub):
    expected = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS), timeout=30)
    server = ServerProcess("--model-repo", str(models.repo), "--workers", "2").start(timeout=180)
    try:
        with grpc.insecure_channel(server.address) as channel:
            workers = pb_grpc.InferenceStub(channel)
            for _ in range(4):  # calls spread over both fronts
                got = workers.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS), timeout=60)
                assert [r.index for r in got.results] == [r.index for r in expected.results]
                np.testing.assert_allclose(
                    [r.score for r in got.results], [r.score for r in expected.results], atol=TOL
                )
            score = workers.Score(pb.ScoreRequest(texts_1=FIRSTS, texts_2=SECONDS), timeout=60)
            assert len(score.results) == len(FIRSTS) and score.method == "cross_encoder"
    finally:
        server.kill()


# --- the client and the CLI -----------------------------------------------------------------------------


def test_client_classifies_reranks_and_scores_pairs(server, stub):
    from bertserve.client import Client

    with Client(server.address, timeout=30) as client:
        classified = client.classify(FIRSTS, pairs=SECONDS, model=PAIR_CLASSIFIER, raw_scores=True)
        direct = stub.Classify(
            pb.ClassifyRequest(inputs=FIRSTS, pairs=SECONDS, model=PAIR_CLASSIFIER, raw_scores=True),
            timeout=30,
        )
        assert [[s.score for s in r.labels] for r in classified.results] == [
            [s.score for s in r.labels] for r in direct.results
        ]
        ranked = client.rerank(QUERY, DOCUMENTS, top_n=3, return_documents=True)
        assert ranked.method == "cross_encoder" and ranked.model == CROSS_ENCODER and len(ranked.results) == 3
        assert all(r.document == DOCUMENTS[r.index] for r in ranked.results)
        scores = [r.score for r in ranked.results]
        assert scores == sorted(scores, reverse=True)
        assert len(ranked.metadata.input_tokens) == len(DOCUMENTS)
        scored = client.score([QUERY], DOCUMENTS)
        by_index = {r.index: r.score for r in client.rerank(QUERY, DOCUMENTS).results}
        np.testing.assert_allclose(scored.scores, [by_index[i] for i in range(len(DOCUMENTS))], atol=1e-6)
        with pytest.raises(grpc.RpcError) as info:
            client.rerank(QUERY, [LONG], truncate=False)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = {m.name: m for m in client.info().models}
        assert info[CROSS_ENCODER].cross_encoder and not info[PAIR_CLASSIFIER].cross_encoder


def test_cli_reranks_and_classifies_pairs(server, stub, capsys):
    from bertserve.cli import main

    expected = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS, top_n=2), timeout=30).results
    argv = ["rerank", "--address", server.address, "--query", QUERY, *DOCUMENTS, "--top-n", "2"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{r.index}  {r.score:.4f}  {DOCUMENTS[r.index]!r}" for r in expected]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [(r["index"], r["document"]) for r in result["results"]] == [
        (r.index, DOCUMENTS[r.index]) for r in expected
    ]
    assert result["method"] == "cross_encoder"

    argv = ["classify", "--address", server.address, "--model", PAIR_CLASSIFIER, "--json", "a cat", "the dog"]
    assert main([*argv, "--pair", "a dog", "--pair", "the cat"]) == 0
    paired = json.loads(capsys.readouterr().out)
    response = stub.Classify(
        pb.ClassifyRequest(inputs=["a cat", "the dog"], pairs=["a dog", "the cat"], model=PAIR_CLASSIFIER),
        timeout=30,
    )
    assert [[s["label"] for s in r["labels"]] for r in paired["results"]] == [
        [s.label for s in r.labels] for r in response.results
    ]
    assert main([*argv, "--pair", "a dog"]) == 1  # one pair for two inputs: the server's refusal, one line
    assert "pairs: 1 texts for 2 inputs" in capsys.readouterr().err


def test_the_manifests_activation_scores_a_cross_encoder(models, tmp_path):
    """`cross_encoder.activation` in the manifest (here identity: the logit) replaces the default sigmoid,
    in Rerank, Score and Classify alike; raw_scores stays the logit."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(models.repo / CROSS_ENCODER, repo / CROSS_ENCODER)
    manifest_path = repo / CROSS_ENCODER / "1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["tasks"]["classify"]["cross_encoder"] = {"activation": "identity"}
    manifest_path.write_text(json.dumps(manifest))
    logits = models.cross_encoder.predict([(QUERY, d) for d in DOCUMENTS], activation_fn=torch.nn.Identity())
    with (
        ServerThread(model_repo=repo, max_queue_delay_ms=5) as server,
        grpc.insecure_channel(server.address) as ch,
    ):
        stub = pb_grpc.InferenceStub(ch)
        ranked = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS), timeout=30)
        np.testing.assert_allclose([r.score for r in ranked.results], np.sort(logits)[::-1], atol=TOL)
        scored = stub.Score(pb.ScoreRequest(texts_1=[QUERY], texts_2=DOCUMENTS), timeout=30)
        np.testing.assert_allclose([r.score for r in scored.results], logits, atol=TOL)
        classified = stub.Classify(pb.ClassifyRequest(inputs=[QUERY] * 5, pairs=DOCUMENTS), timeout=30)
        np.testing.assert_allclose([r.labels[0].score for r in classified.results], logits, atol=TOL)
