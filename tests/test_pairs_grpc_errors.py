"""Sentence pairs over gRPC bertserve.v1: bad requests get their status naming the field and limit, before
any work where the request alone decides (the models of tests/helpers/pair_grpc.py on 127.0.0.1)."""

from __future__ import annotations

import grpc
import pytest

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc as pb_grpc
from tests.helpers.pair_grpc import (
    DOCUMENTS,
    EMBED,
    FIRSTS,
    LONG,
    MAX_INPUTS,
    PAIR_CLASSIFIER,
    QUERY,
    SECONDS,
    Models,
)
from tests.helpers.server import ServerThread, metric, scrape


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
