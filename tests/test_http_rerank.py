"""Rerank and score over HTTP, in every shape the server speaks (Jina/vLLM /v1/rerank, Cohere /v2/rerank with
the real `cohere` SDK, TEI /rerank, vLLM /v1/score, bertserve.v1 JSON), against sentence-transformers'
`CrossEncoder.predict` and transformers on the tiny pair models exported through `bertserve export`
(tests/pair_models.py), within 1e-4."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.helpers.server import ServerThread

TOLERANCE = 1e-4
CROSS_ENCODER, PAIR_CLASSIFIER, EMBED = "tiny-cross-encoder", "tiny-pair-classifier", "tiny-embed"
QUERY = "where is the cat"
DOCS = ["the cat sat on the mat", "paris is the capital", "a dog", "the mat is in paris", "cat and dog", "a"]
LONG_DOC = "the cat sat on the mat and the dog sat in paris " * 6  # over the cross-encoder's max_length 40


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


@pytest.fixture(scope="module")
def server(pair_repo):
    with ServerThread(model_repo=pair_repo, max_queue_delay_ms=5) as server:
        yield server


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.http_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def expected(tiny_cross_encoder) -> np.ndarray:
    """CrossEncoder.predict's score of (QUERY, doc) for each of DOCS."""
    return tiny_cross_encoder.expected_scores([(QUERY, doc) for doc in DOCS])


def ok(response: httpx.Response) -> dict | list:
    assert response.status_code == 200, response.text[:500]
    return response.json()


def check_ranking(results: list[dict], expected: np.ndarray, score: str, top: int | None = None) -> None:
    """Each score is the reference's for its document, best first; the `top` (None: all) best documents
    (up to near-ties that float rounding may order either way)."""
    indices = [r["index"] for r in results]
    got = np.array([r[score] for r in results])
    assert len(indices) == len(set(indices)) == min(top or len(expected), len(expected))
    assert np.abs(got - expected[indices]).max() <= TOLERANCE
    assert all(got[i] >= got[i + 1] for i in range(len(got) - 1))
    left_out = np.delete(expected, indices)
    assert not left_out.size or left_out.max() <= expected[indices].min() + TOLERANCE


def test_v1_rerank_matches_cross_encoder(http, expected):
    documents = [doc if i % 2 else {"text": doc} for i, doc in enumerate(DOCS)]  # both forms Jina takes
    body = ok(http.post("/v1/rerank", json={"query": QUERY, "documents": documents}))
    assert body["model"] == CROSS_ENCODER  # the default reranker: the loaded cross-encoder
    check_ranking(body["results"], expected, "relevance_score")
    assert all(r["document"] == {"text": DOCS[r["index"]]} for r in body["results"])  # return_documents: true
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] > len(DOCS)
    top = ok(
        http.post(
            "/v1/rerank",
            json={
                "model": CROSS_ENCODER,
                "query": QUERY,
                "documents": DOCS,
                "top_n": 2,
                "return_documents": False,
            },
        )
    )
    check_ranking(top["results"], expected, "relevance_score", top=2)
    assert all("document" not in r for r in top["results"])
    many = ok(http.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 100}))
    assert len(many["results"]) == len(DOCS)


def test_cohere_sdk_reranks_through_v2(server, http, expected):
    import cohere

    client = cohere.ClientV2(api_key="x", base_url=server.http_url)
    reply = client.rerank(model=CROSS_ENCODER, query=QUERY, documents=DOCS, top_n=3)
    check_ranking(
        [{"index": r.index, "relevance_score": r.relevance_score} for r in reply.results],
        expected,
        "relevance_score",
        top=3,
    )
    assert reply.meta.api_version.version == "2" and reply.id
    full = ok(
        http.post(
            "/v2/rerank",
            json={"model": CROSS_ENCODER, "query": QUERY, "documents": DOCS, "return_documents": True},
        )
    )
    check_ranking(full["results"], expected, "relevance_score")
    assert all(r["document"]["text"] == DOCS[r["index"]] for r in full["results"])
    plain = ok(http.post("/v2/rerank", json={"model": CROSS_ENCODER, "query": QUERY, "documents": DOCS}))
    assert all("document" not in r for r in plain["results"])  # Cohere v2 returns none by default
    with pytest.raises(cohere.NotFoundError) as missing:
        client.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS)
    assert missing.value.status_code == 404 and "rerank-v3.5" in str(missing.value.body)


def test_tei_rerank(http, expected, tiny_cross_encoder):
    ranks = ok(http.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}))
    check_ranking(ranks, expected, "score")
    assert all(r["text"] == DOCS[r["index"]] for r in ranks)
    raw = ok(http.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}))
    logits = tiny_cross_encoder.expected_logits([QUERY] * len(DOCS), DOCS)[:, 0]
    check_ranking(raw, logits, "score")
    assert all("text" not in r for r in raw)


def test_rerank_cuts_long_documents_only_second(http, tiny_cross_encoder):
    """A document over max_length is cut at its end (only_second), the query kept whole, as transformers
    cuts it; TEI's truncate false refuses it instead."""
    logit = tiny_cross_encoder.expected_logits([QUERY], [LONG_DOC], truncation="only_second")[0, 0]
    body = ok(http.post("/bertserve/v1/rerank", json={"query": QUERY, "documents": [LONG_DOC, "a"]}))
    first = next(r for r in body["results"] if r["index"] == 0)
    assert abs(first["score"] - sigmoid(logit)) <= TOLERANCE and first["truncated"]
    assert body["method"] == "cross_encoder" and body["metadata"]["model"] == CROSS_ENCODER
    refused = http.post("/rerank", json={"query": QUERY, "texts": [LONG_DOC], "truncate": False})
    assert refused.status_code == 400 and "max_length" in refused.json()["error"]["message"]


def test_vllm_score(http, tiny_cross_encoder, expected):
    one_to_many = ok(http.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS}))
    assert one_to_many["object"] == "list" and one_to_many["model"] == CROSS_ENCODER
    assert [d["index"] for d in one_to_many["data"]] == list(range(len(DOCS)))
    assert np.abs(np.array([d["score"] for d in one_to_many["data"]]) - expected).max() <= TOLERANCE
    firsts, seconds = ["a dog", "the cat", "paris"], ["cat and dog", "the mat", "the capital of a dog"]
    pairs = ok(http.post("/v1/score", json={"model": CROSS_ENCODER, "text_1": firsts, "text_2": seconds}))
    want = tiny_cross_encoder.expected_scores(list(zip(firsts, seconds, strict=True)))
    assert np.abs(np.array([d["score"] for d in pairs["data"]]) - want).max() <= TOLERANCE
    assert pairs["usage"]["total_tokens"] > 3
    long = {"text_1": QUERY, "text_2": LONG_DOC}
    assert http.post("/v1/score", json=long).status_code == 400  # vLLM cuts only when asked to
    cut = ok(http.post("/v1/score", json={**long, "truncate_prompt_tokens": -1}))
    logit = tiny_cross_encoder.expected_logits([QUERY], [LONG_DOC])[0, 0]  # longest_first
    assert abs(cut["data"][0]["score"] - sigmoid(logit)) <= TOLERANCE


def test_bertserve_score_and_classify_pairs(http, tiny_cross_encoder, tiny_pair_classifier):
    firsts, seconds = ["a dog", "the cat sat", "paris"], ["cat and dog", "on the mat", "is the capital"]
    body = ok(
        http.post("/bertserve/v1/score", json={"texts_1": firsts, "texts_2": seconds, "raw_scores": True})
    )
    logits = tiny_cross_encoder.expected_logits(firsts, seconds)[:, 0]
    assert np.abs(np.array([r["score"] for r in body["results"]]) - logits).max() <= TOLERANCE
    assert body["method"] == "cross_encoder" and not any(r["truncated"] for r in body["results"])
    classified = ok(
        http.post(
            "/bertserve/v1/classify",
            json={"model": PAIR_CLASSIFIER, "inputs": firsts, "pairs": seconds, "raw_scores": True},
        )
    )
    want = tiny_pair_classifier.expected_logits(firsts, seconds)
    for row, labels in zip(want, classified["results"], strict=True):
        got = {entry["index"]: entry["score"] for entry in labels["labels"]}
        assert np.abs(np.array([got[i] for i in range(3)]) - row).max() <= TOLERANCE
    cut = ok(
        http.post(
            "/bertserve/v1/classify",
            json={
                "model": PAIR_CLASSIFIER,
                "inputs": [LONG_DOC],
                "pairs": [QUERY],
                "truncate": True,
                "truncation_strategy": "only_first",
                "raw_scores": True,
            },
        )
    )
    want = tiny_pair_classifier.expected_logits([LONG_DOC], [QUERY], truncation="only_first")[0]
    got = {entry["index"]: entry["score"] for entry in cut["results"][0]["labels"]}
    assert np.abs(np.array([got[i] for i in range(3)]) - want).max() <= TOLERANCE
    assert cut["metadata"]["truncated"] == [True]


def test_rerank_with_an_embedding_model_is_cosine(http):
    body = ok(http.post("/bertserve/v1/rerank", json={"model": EMBED, "query": QUERY, "documents": DOCS}))
    assert body["method"] == "cosine"
    vectors = ok(http.post("/bertserve/v1/embed", json={"model": EMBED, "inputs": [QUERY, *DOCS]}))[
        "embeddings"
    ]
    unit = np.array([v["values"] for v in vectors])
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    check_ranking(body["results"], unit[1:] @ unit[0], "score")
    jina = ok(http.post("/v1/rerank", json={"model": EMBED, "query": QUERY, "documents": DOCS, "top_n": 1}))
    assert jina["results"][0]["index"] == body["results"][0]["index"] and jina["model"] == EMBED


def test_openapi_describes_the_pair_routes(http):
    paths = ok(http.get("/openapi.json"))["paths"]
    required = {
        "/v1/rerank": ["query", "documents"],
        "/v2/rerank": ["query", "documents"],
        "/rerank": ["query", "texts"],
        "/v1/score": ["text_1", "text_2"],
        "/bertserve/v1/rerank": ["query", "documents"],
        "/bertserve/v1/score": ["texts_1", "texts_2"],
    }
    for path, fields in required.items():
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert schema["required"] == fields, path
    classify = paths["/bertserve/v1/classify"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"pairs", "truncation_strategy"} <= set(classify["properties"])
