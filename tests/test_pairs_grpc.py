"""Sentence pairs over gRPC bertserve.v1 on real exported graphs: Classify with pairs, Rerank and Score.

A tiny random pair classifier (BertForSequenceClassification, 3 labels), a tiny random sentence-transformers
CrossEncoder (num_labels 1, written by its `save`) and a tiny embedding model, each exported with
`bertserve export`, are served on 127.0.0.1. Answers are compared within 1e-4 with transformers' logits,
with `CrossEncoder.predict`, and (cosine) with the server's own normalized embeddings.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc as pb_grpc
from tests.helpers.checkpoints import make_checkpoint
from tests.helpers.server import ServerProcess, ServerThread, metric, scrape

PAIR_CLASSIFIER, CROSS_ENCODER, EMBED = "tiny-pair-classifier", "tiny-cross-encoder", "tiny-embed"
MAX_INPUTS = 8
TOL = 1e-4
INIT_RANGE = 0.2  # wider than transformers' 0.02: a tiny random model's scores then depend on its inputs
QUERY = "the capital of paris"
DOCUMENTS = ["paris is the capital", "a dog sat on the mat", "the cat", "capital of the dog", "the cat"]
FIRSTS = ["the cat sat on the mat", "a dog", "paris is the capital", "the mat"]
SECONDS = ["a cat is on a mat", "the dog sat", "capital of paris", "to the dog and the cat"]
LONG = " ".join(["the cat sat on the mat"] * 20)  # 120 tokens: over every model's max_length


class Models:
    """The exported repository and the references its models are compared with."""

    def __init__(self, repo: Path, classifier: Path, cross_encoder: Path):
        import transformers
        from sentence_transformers import CrossEncoder

        self.repo = repo
        self.classifier = transformers.BertForSequenceClassification.from_pretrained(
            classifier, attn_implementation="eager"
        ).eval()
        self.tokenizer = transformers.BertTokenizerFast(tokenizer_file=str(classifier / "tokenizer.json"))
        self.cross_encoder = CrossEncoder(str(cross_encoder), device="cpu")
        self.cross_encoder_logits_model = transformers.BertForSequenceClassification.from_pretrained(
            cross_encoder, attn_implementation="eager"
        ).eval()

    def logits(self, model, firsts, seconds, truncation="longest_first", max_length=None) -> np.ndarray:
        batch = self.tokenizer(
            list(firsts), list(seconds), truncation=truncation, max_length=max_length, padding=True,
            return_tensors="pt",
        )  # fmt: skip
        with torch.no_grad():
            return model(**batch).logits.numpy()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Models:
    from bertserve.cli import main

    scratch = tmp_path_factory.mktemp("pair-checkpoints")
    repo = tmp_path_factory.mktemp("pair-repo")
    from sentence_transformers import CrossEncoder

    classifier = make_checkpoint(
        scratch / "classifier", "BertForSequenceClassification", num_labels=3, seed=11,
        initializer_range=INIT_RANGE,
    )  # fmt: skip
    base = make_checkpoint(
        scratch / "cross-base", "BertForSequenceClassification", num_labels=1, seed=12,
        initializer_range=INIT_RANGE,
    )  # fmt: skip
    cross_encoder = scratch / "cross-encoder"
    CrossEncoder(str(base), device="cpu", num_labels=1).save(str(cross_encoder))
    embed = make_checkpoint(scratch / "embed", "BertModel", seed=13, initializer_range=INIT_RANGE)
    for name, checkpoint in ((PAIR_CLASSIFIER, classifier), (CROSS_ENCODER, cross_encoder), (EMBED, embed)):
        argv = [
            "export",
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(repo),
            "--name",
            name,
            "--version",
            "1",
        ]
        assert main(argv) == 0, f"bertserve export of {name} failed"
    return Models(repo, classifier, cross_encoder)


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


def test_cosine_pairs_over_max_queue_inputs_are_invalid_not_retried(models):
    """Cosine Rerank embeds the documents and the query, N:N Score both sides: a call that needs more
    texts than the queue can ever hold is INVALID_ARGUMENT naming the bound, not "retry later"."""
    settings = dict(model_repo=models.repo, models=[EMBED], max_queue_inputs=4, max_queue_delay_ms=5)
    with ServerThread(**settings) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        calls = [
            ("Rerank", pb.RerankRequest(query=QUERY, documents=DOCUMENTS[:4]), "documents: ", 5),
            ("Score", pb.ScoreRequest(texts_1=FIRSTS[:3], texts_2=SECONDS[:3]), "texts_2: ", 6),
        ]
        for rpc, request, field, count in calls:
            with pytest.raises(grpc.RpcError) as info:
                getattr(stub, rpc)(request, timeout=30)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
            assert info.value.details().startswith(field)
            assert f"{count} texts embedded, more than max_queue_inputs 4" in info.value.details()
        assert (
            len(stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS[:3]), timeout=30).results) == 3
        )


# --- bad input ------------------------------------------------------------------------------------------

INVALID, PRECONDITION = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
TOO_MANY = ["the cat"] * (MAX_INPUTS + 1)
BAD = [
    ("Rerank", pb.RerankRequest(query=QUERY, documents=TOO_MANY), INVALID,
     f"documents: {MAX_INPUTS + 1} documents is more than max_inputs_per_request {MAX_INPUTS}"),
    ("Rerank", pb.RerankRequest(query=QUERY), INVALID, "documents: at least one document is required"),
    ("Rerank", pb.RerankRequest(query=QUERY, documents=["a"], top_n=0), INVALID, "top_n: must be at least 1"),
    ("Rerank", pb.RerankRequest(query="", documents=["a"]), INVALID, "query: empty or whitespace-only text"),
    ("Rerank", pb.RerankRequest(query=QUERY, documents=["a", " "]), INVALID, "documents[1]: empty"),
    ("Rerank", pb.RerankRequest(query=LONG, documents=["a"]), INVALID, "query: 120 tokens leave no room for documents[0]"),
    ("Rerank", pb.RerankRequest(query=QUERY, documents=["a"], model=PAIR_CLASSIFIER), PRECONDITION,
     f"model {PAIR_CLASSIFIER}: has 3 labels; Rerank and Score need one score per pair"),
    ("Rerank", pb.RerankRequest(query=QUERY, documents=["a", LONG], model=EMBED, truncate=False), INVALID,
     "documents[1]: 122 tokens is more than the model's max_length"),
    ("Score", pb.ScoreRequest(texts_1=["a", LONG], texts_2=["b", "c"], model=EMBED), INVALID,
     "texts_1[1]: 122 tokens is more than the model's max_length"),
    ("Score", pb.ScoreRequest(texts_1=["a", "b"], texts_2=["a", "b", "c"]), INVALID,
     "texts_1: 2 texts for 3 texts_2"),
    ("Score", pb.ScoreRequest(texts_1=["a"], texts_2=TOO_MANY), INVALID,
     f"texts_2: {MAX_INPUTS + 1} texts is more than max_inputs_per_request {MAX_INPUTS}"),
    ("Score", pb.ScoreRequest(texts_1=["a"], texts_2=["b"], truncation_strategy="shortest"), INVALID,
     "truncation_strategy: 'shortest' is not one of longest_first, only_first, only_second"),
    ("Score", pb.ScoreRequest(texts_1=["a"], texts_2=[LONG]), INVALID,
     "texts_2[0]: 124 tokens (pair) is more than the model's max_length"),
    ("Score", pb.ScoreRequest(texts_1=["a"], texts_2=["b"], model=PAIR_CLASSIFIER), PRECONDITION, "has 3 labels"),
    ("Classify", pb.ClassifyRequest(inputs=["a", "b"], pairs=["c"]), INVALID,
     "pairs: 1 texts for 2 inputs; give one per input"),
    ("Classify", pb.ClassifyRequest(inputs=["a"], pairs=["b"], truncation_strategy="only-second"), INVALID,
     "truncation_strategy: 'only-second' is not one of"),
    ("Classify", pb.ClassifyRequest(inputs=["a"], truncation_strategy="bogus"), INVALID,
     "truncation_strategy: 'bogus' is not one of"),
    ("Classify", pb.ClassifyRequest(inputs=["a"], pairs=[LONG]), INVALID,
     "inputs[0]: 124 tokens (pair) is more than the model's max_length"),
    ("Classify", pb.ClassifyRequest(inputs=["a"], pairs=["\x01"]), INVALID, "pairs[0]: control character U+0001"),
    ("Classify", pb.ClassifyRequest(inputs=TOO_MANY, pairs=TOO_MANY), INVALID,
     f"inputs: {MAX_INPUTS + 1} inputs is more than max_inputs_per_request {MAX_INPUTS}"),
]  # fmt: skip


@pytest.mark.parametrize(("rpc", "request_message", "code", "message"), BAD, ids=[b[3][:40] for b in BAD])
def test_bad_pair_requests_get_their_status(stub, server, rpc, request_message, code, message):
    before = scrape(server.metrics_url)
    with pytest.raises(grpc.RpcError) as info:
        getattr(stub, rpc)(request_message, timeout=30)
    assert info.value.code() == code, info.value.details()
    assert message in info.value.details()
    if "max_inputs_per_request" in message or code == PRECONDITION or "is not one of" in message:
        after = scrape(server.metrics_url)  # refused before any work on the texts
        assert metric(after, "bertserve_tokenized_inputs_total") == metric(
            before, "bertserve_tokenized_inputs_total"
        )
    assert stub.Rerank(
        pb.RerankRequest(query=QUERY, documents=["a cat"]), timeout=30
    ).results  # still serving


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


def test_a_model_with_one_segment_embedding_refuses_pairs(tmp_path, make_tiny_checkpoint):
    """type_vocab_size 1: segment id 1 has no embedding, so pairs are refused before any work (not a
    failed graph run); its single texts still classify."""
    from bertserve.cli import main

    checkpoint = make_tiny_checkpoint("BertForSequenceClassification", type_vocab_size=1)
    repo = tmp_path / "repo"
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(repo), "--name", "one-segment"]) == 0
    with (
        ServerThread(model_repo=repo, max_queue_delay_ms=5) as server,
        grpc.insecure_channel(server.address) as ch,
    ):
        stub = pb_grpc.InferenceStub(ch)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Classify(pb.ClassifyRequest(inputs=["a cat"], pairs=["a dog"]), timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "pairs: model one-segment has one segment embedding" in refused.value.details()
        with pytest.raises(grpc.RpcError) as first:  # refused before its texts are read
            stub.Classify(pb.ClassifyRequest(inputs=["a cat"], pairs=["\x01"]), timeout=30)
        assert first.value.details().startswith("pairs: model one-segment has one segment embedding")
        assert len(stub.Classify(pb.ClassifyRequest(inputs=["a cat"]), timeout=30).results) == 1
