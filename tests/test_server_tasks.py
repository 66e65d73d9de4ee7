"""Embed, FillMask, Classify, Tokenize and Info through a real server, against transformers itself."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch
import transformers

from bertserve.client import Client

SENTENCES = ["the cat sat on the mat", "paris is the capital of a dog", "a"]


@pytest.fixture(scope="module")
def client(tiny_server):
    with Client(tiny_server.address, timeout=30) as c:
        yield c


def reference_embeddings(checkpoint, texts, pooling):
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    model = transformers.AutoModel.from_pretrained(checkpoint).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # (B, T, H)
    if pooling == "cls":
        return hidden[:, 0].numpy()
    mask = batch["attention_mask"].unsqueeze(-1).float()  # (B, T, 1)
    return ((hidden * mask).sum(1) / mask.sum(1)).numpy()


def test_embed_equals_transformers_mean_pooling(client, make_tiny_checkpoint):
    info = {m.name: m for m in client.info().models}["tiny-embed"]
    assert info.pooling == "mean"
    expected = reference_embeddings(make_tiny_checkpoint("BertModel"), SENTENCES, "mean")
    raw = client.embed(SENTENCES, model="tiny-embed", normalize=False)
    got = raw.vectors
    assert got.shape == (3, 48) and raw.dimension == 48
    assert np.abs(got - expected).max() <= 1e-4
    unit = client.embed(SENTENCES, model="tiny-embed", normalize=True)
    got_unit = unit.vectors
    expected_unit = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.abs(got_unit - expected_unit).max() <= 1e-4
    meta = raw.metadata
    assert meta.model == "tiny-embed" and meta.model_version == 1
    assert list(meta.input_tokens) == [8, 9, 3] and meta.total_tokens == 20  # [CLS] ... [SEP]
    assert list(meta.truncated) == [False] * 3 and meta.batches >= 1 and meta.inference_time_ms > 0


def test_fill_mask_top5_equals_transformers_pipeline(client, make_tiny_checkpoint):
    checkpoint = make_tiny_checkpoint("BertForMaskedLM")
    pipe = transformers.pipeline("fill-mask", model=str(checkpoint), tokenizer=str(checkpoint), device="cpu")
    texts = ["paris is the capital of [MASK].", "the [MASK] sat on the mat"]
    response = client.fill_mask(texts, model="tiny-mlm", top_k=5)
    for text, result in zip(texts, response.results, strict=True):
        expected = pipe(text, top_k=5)
        (mask,) = result.masks
        assert [c.token_id for c in mask.candidates] == [e["token"] for e in expected]
        assert [c.token for c in mask.candidates] == [e["token_str"] for e in expected]
        assert np.allclose([c.score for c in mask.candidates], [e["score"] for e in expected], atol=1e-5)
        assert [c.sequence for c in mask.candidates] == [e["sequence"] for e in expected]


def test_fill_mask_many_masks_and_inputs_in_order(client):
    texts = ["[MASK] cat [MASK] on the mat", "the dog is [MASK]"]
    both = client.fill_mask(texts, model="tiny-mlm", top_k=3)
    assert [len(r.masks) for r in both.results] == [2, 1]
    assert [m.position for m in both.results[0].masks] == [1, 3]
    alone = client.fill_mask(texts[1:], model="tiny-mlm", top_k=3)
    assert [c.token_id for c in alone.results[0].masks[0].candidates] == [
        c.token_id for c in both.results[1].masks[0].candidates
    ]
    assert "[MASK]" in both.results[0].masks[0].candidates[0].sequence  # the other mask is kept


def test_classify_equals_transformers_pipeline(client, make_tiny_checkpoint):
    checkpoint = make_tiny_checkpoint("BertForSequenceClassification")
    pipe = transformers.pipeline(
        "text-classification", model=str(checkpoint), tokenizer=str(checkpoint), device="cpu"
    )
    response = client.classify(SENTENCES, model="tiny-classifier")
    for text, result in zip(SENTENCES, response.results, strict=True):
        expected = {e["label"]: e["score"] for e in pipe(text, top_k=None)}
        got = {s.label: s.score for s in result.labels}
        assert got.keys() == expected.keys()
        assert max(abs(got[k] - expected[k]) for k in got) <= 1e-4
        scores = [s.score for s in result.labels]
        assert scores == sorted(scores, reverse=True)
    top1 = client.classify(SENTENCES[:1], model="tiny-classifier", top_k=1).results[0].labels
    assert len(top1) == 1 and top1[0].label == response.results[0].labels[0].label
    raw = client.classify(SENTENCES[:1], model="tiny-classifier", raw_scores=True).results[0].labels
    logits = np.array([s.score for s in sorted(raw, key=lambda s: s.index)])
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert np.allclose(sorted(probs, reverse=True), [s.score for s in response.results[0].labels], atol=1e-5)


def test_tokenize_matches_the_tokenizer(client, make_tiny_checkpoint):
    tokenizer = transformers.AutoTokenizer.from_pretrained(make_tiny_checkpoint("BertModel"))
    text = "The cat sat, on 12 mats!"
    result = client.tokenize([text], model="tiny-embed").results[0]
    expected = tokenizer(text, return_offsets_mapping=True)
    assert [t.id for t in result.tokens] == expected["input_ids"]
    assert [(t.start, t.end) for t in result.tokens] == [tuple(o) for o in expected["offset_mapping"]]
    assert [t.special for t in result.tokens] == [True] + [False] * (len(result.tokens) - 2) + [True]


def test_truncation_and_length_limit(client):
    info = {m.name: m for m in client.info().models}["tiny-embed"]
    long_text = " ".join(["cat"] * (info.max_length + 10))
    with pytest.raises(grpc.RpcError) as refused:
        client.embed([long_text], model="tiny-embed")
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"max_length {info.max_length}" in refused.value.details()
    cut = client.embed(["a cat", long_text], model="tiny-embed", truncate=True)
    assert list(cut.metadata.truncated) == [False, True]
    assert list(cut.metadata.input_tokens) == [4, info.max_length]


def test_default_models_and_errors(client):
    info = client.info()
    defaults = {rpc: m.name for m in info.models for rpc in m.default_for}
    assert defaults["FillMask"] == "tiny-mlm" and defaults["Classify"] == "tiny-classifier"
    assert client.fill_mask(["the [MASK] sat"]).metadata.model == "tiny-mlm"
    assert info.limits.max_inputs_per_request > 0 and info.versions["onnxruntime"]
    cases = [
        (lambda: client.embed(["x"], model="no-such-model"), grpc.StatusCode.NOT_FOUND, "no-such-model"),
        (
            lambda: client.fill_mask(["the [MASK]"], model="tiny-embed"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "",
        ),
        (
            lambda: client.fill_mask(["no mask here"], model="tiny-mlm"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "[MASK]",
        ),
        (
            lambda: client.fill_mask(["a [MASK]"], model="tiny-mlm", top_k=0),
            grpc.StatusCode.INVALID_ARGUMENT,
            "top_k",
        ),
        (lambda: client.embed([]), grpc.StatusCode.INVALID_ARGUMENT, "inputs"),
        (lambda: client.embed(["ok", "  "]), grpc.StatusCode.INVALID_ARGUMENT, "inputs[1]"),
        (lambda: client.embed(["nul\x00"]), grpc.StatusCode.INVALID_ARGUMENT, "U+0000"),
        (lambda: client.classify(["x"], top_k=99), grpc.StatusCode.INVALID_ARGUMENT, "number of labels"),
    ]
    for call, code, needle in cases:
        with pytest.raises(grpc.RpcError) as failure:
            call()
        assert failure.value.code() is code, failure.value.details()
        assert needle in failure.value.details()
    assert client.health() == "SERVING"


def test_undecodable_request_is_invalid_argument(tiny_server):
    with grpc.insecure_channel(tiny_server.address) as channel:
        raw = channel.unary_unary("/bertserve.v1.Inference/Embed", request_serializer=None)
        with pytest.raises(grpc.RpcError) as failure:
            raw(b"\x0a\x02\xff\xfe", timeout=10)  # inputs[0] is not UTF-8
    assert failure.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "bertserve.v1.EmbedRequest" in failure.value.details()


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_reduced_precision_encoders_serve_close_embeddings(tiny_repo, tiny_server, precision):
    from tests.helpers.server import ServerThread

    with Client(tiny_server.address, timeout=30) as fp32_client:
        reference = fp32_client.embed(SENTENCES, model="tiny-embed").vectors
    server = ServerThread(model_repo=tiny_repo, models=["tiny-embed"], precision=precision)
    with server, Client(server.address, timeout=30) as client:
        assert client.info().models[0].precision == precision
        got = client.embed(SENTENCES).vectors
    cosine = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() > 0.98
