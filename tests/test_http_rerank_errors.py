"""Bad input on the rerank and score routes: each case gets its 4xx naming the field (never a 500), and the
server answers a good request after them all; the body bounds of pair routes (two texts per input, the
body size)."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.server import ServerThread, metric, scrape

CROSS, CLASSIFIER = "tiny-cross-encoder", "tiny-pair-classifier"
LIMIT = 256  # the default max_inputs_per_request
LONG = "the cat sat on the mat and the dog sat in paris " * 6
Q = {"query": "q"}
COHERE = {"model": CROSS, **Q}

# (id, path, body, status, the message's field (None: not checked), a part of the message)
CASES = [
    ("jina no query", "/v1/rerank", {"documents": ["a"]}, 400, "query", "query: required"),
    ("jina query number", "/v1/rerank", {"query": 3, "documents": ["a"]}, 400, "query", "must be a string"),
    ("jina no documents", "/v1/rerank", Q, 400, "documents", "documents: required"),
    ("jina empty", "/v1/rerank", {**Q, "documents": []}, 400, "documents", "documents: empty"),
    ("jina not array", "/v1/rerank", {**Q, "documents": "a"}, 400, "documents", "must be an array"),
    ("jina too many", "/v1/rerank", {**Q, "documents": ["a"] * (LIMIT + 1)}, 400, "documents", f"{LIMIT}"),
    ("jina number doc", "/v1/rerank", {**Q, "documents": ["a", 1]}, 400, "documents[1]", "must be a string"),
    ("jina image doc", "/v1/rerank", {**Q, "documents": [{"image": "x"}]}, 400, "documents[0]", '{"text"'),
    ("jina top_n 0", "/v1/rerank", {**Q, "documents": ["a"], "top_n": 0}, 400, "top_n", "at least 1"),
    ("jina top_n -1", "/v1/rerank", {**Q, "documents": ["a"], "top_n": -1}, 400, "top_n", "at least 1"),
    ("jina top_n text", "/v1/rerank", {**Q, "documents": ["a"], "top_n": "2"}, 400, "top_n", "an integer"),
    (
        "jina unknown",
        "/v1/rerank",
        {**Q, "documents": ["a"], "rank_fields": []},
        400,
        "rank_fields",
        "unknown",
    ),
    ("jina no model", "/v1/rerank", {**Q, "documents": ["a"], "model": "nope"}, 404, None, "nope"),
    ("jina 3 labels", "/v1/rerank", {**Q, "documents": ["a"], "model": CLASSIFIER}, None, None, "3 labels"),
    (
        "jina prompt tokens",
        "/v1/rerank",
        {**Q, "documents": ["a"], "truncate_prompt_tokens": 5},
        400,
        "truncate_prompt_tokens",
        "max_length 40",
    ),
    ("cohere no documents", "/v2/rerank", COHERE, 400, "documents", "documents: required"),
    ("cohere empty", "/v2/rerank", {**COHERE, "documents": []}, 400, "documents", "empty"),
    ("cohere top_n 0", "/v2/rerank", {**COHERE, "documents": ["a"], "top_n": 0}, 400, "top_n", "at least 1"),
    (
        "cohere tokens per doc",
        "/v2/rerank",
        {**COHERE, "documents": ["a"], "max_tokens_per_doc": 8},
        400,
        "max_tokens_per_doc",
        "max_length 40",
    ),
    (
        "cohere spans",
        "/v2/rerank",
        {**COHERE, "documents": ["a"], "relevant_spans": {"mode": "enabled"}},
        400,
        "relevant_spans",
        "not supported",
    ),
    (
        "cohere return flag",
        "/v2/rerank",
        {**COHERE, "documents": ["a"], "return_documents": 1},
        400,
        None,
        "true",
    ),
    ("tei no texts", "/rerank", Q, 400, "texts", "texts: required"),
    ("tei empty", "/rerank", {**Q, "texts": []}, 400, "texts", "texts: empty"),
    ("tei too many", "/rerank", {**Q, "texts": ["a"] * (LIMIT + 1)}, 400, "texts", f"{LIMIT}"),
    ("tei object", "/rerank", {**Q, "texts": [{"text": "a"}]}, 400, "texts[0]", "must be a string"),
    (
        "tei left",
        "/rerank",
        {**Q, "texts": ["a"], "truncation_direction": "left"},
        400,
        "truncation_direction",
        "right",
    ),
    ("tei too long", "/rerank", {**Q, "texts": [LONG], "truncate": False}, 400, None, "max_length"),
    ("tei long query", "/rerank", {"query": "x" * 30_000, "texts": ["a"]}, 400, "query", "max_input_chars"),
    ("score no text_2", "/v1/score", {"text_1": "a"}, 400, "text_2", "required"),
    ("score empty", "/v1/score", {"text_1": [], "text_2": "a"}, 400, "text_1", "non-empty"),
    ("score counts", "/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, 400, None, "text_2"),
    ("score number", "/v1/score", {"text_1": "a", "text_2": ["b", 2]}, 400, "text_2[1]", "must be a string"),
    (
        "score zero tokens",
        "/v1/score",
        {"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 0},
        400,
        None,
        "-1",
    ),
    (
        "score too many",
        "/v1/score",
        {"text_1": "a", "text_2": ["b"] * (LIMIT + 1)},
        400,
        "text_2",
        f"{LIMIT}",
    ),
    (
        "bertserve rerank top_n",
        "/bertserve/v1/rerank",
        {**Q, "documents": ["a"], "top_n": 0},
        400,
        "top_n",
        "1",
    ),
    ("bertserve rerank docs", "/bertserve/v1/rerank", {**Q, "documents": "a"}, 400, "documents", "array"),
    ("bertserve score", "/bertserve/v1/score", {"texts_1": ["a"], "texts_2": "b"}, 400, "texts_2", "array"),
    ("bertserve score none", "/bertserve/v1/score", {"texts_1": ["a"]}, 400, "texts_2", "required"),
    (
        "classify pairs count",
        "/bertserve/v1/classify",
        {"model": CLASSIFIER, "inputs": ["a", "b"], "pairs": ["c"]},
        400,
        None,
        "pairs",
    ),
    (
        "classify strategy",
        "/bertserve/v1/classify",
        {"model": CLASSIFIER, "inputs": ["a"], "pairs": ["b"], "truncation_strategy": "middle"},
        400,
        None,
        "truncation_strategy",
    ),
    (
        "classify strategy without pairs",
        "/bertserve/v1/classify",
        {"model": CLASSIFIER, "inputs": ["a"], "truncation_strategy": "bogus"},
        400,
        None,
        "truncation_strategy: 'bogus' is not one of",
    ),
]


@pytest.fixture(scope="module")
def server(pair_repo):
    with ServerThread(model_repo=pair_repo, max_queue_delay_ms=5) as server:
        yield server


def test_bad_input_is_refused_with_the_field_named(server):
    with httpx.Client(base_url=server.http_url, timeout=60) as client:
        for case, path, body, status, field, part in CASES:
            response = client.post(path, json=body)
            error = response.json()["error"]
            if status is None:  # the core's choice: INVALID_ARGUMENT or FAILED_PRECONDITION
                assert response.status_code in (400, 422), (case, response.text)
            else:
                assert response.status_code == status, (case, response.text)
            assert part in error["message"], (case, error)
            if field is not None:
                assert error["param"] == field, (case, error)
        good = client.post("/v1/rerank", json={"query": "a cat", "documents": ["a dog", "the mat"]})
        assert good.status_code == 200 and len(good.json()["results"]) == 2
    samples = scrape(server.metrics_url)
    assert metric(samples, "bertserve_requests_total", code="INTERNAL") == 0


@pytest.fixture(scope="module")
def limits_server(pair_repo):
    """More inputs than the JSON count check's allowance for structure, in a small body."""
    with ServerThread(
        model_repo=pair_repo,
        max_queue_delay_ms=5,
        max_inputs_per_request=1100,
        max_queue_inputs=2200,
        max_message_bytes=128 * 1024,
        http_max_body_bytes_in_flight=128 * 1024,
    ) as server:
        yield server


def test_pair_routes_take_two_texts_per_input(limits_server):
    """A request of max_inputs_per_request pairs (or document objects: a key and a text each) holds twice
    the strings of one of single texts; the body's count check allows it (JSON routes and KServe REST),
    and the route refuses one document more."""
    docs = [{"text": f"d{i}"} for i in range(1100)]
    firsts = [f"a{i}" for i in range(1100)]
    with httpx.Client(base_url=limits_server.http_url, timeout=120) as client:
        reranked = client.post("/v1/rerank", json={"query": "a", "documents": docs, "top_n": 1})
        assert reranked.status_code == 200, reranked.text[:300]
        classified = client.post(
            "/bertserve/v1/classify",
            json={"model": CLASSIFIER, "inputs": firsts, "pairs": firsts, "top_k": 1},
        )
        assert classified.status_code == 200, classified.text[:300]
        assert len(classified.json()["results"]) == 1100
        tensors = [
            {"name": name, "datatype": "BYTES", "shape": [1100], "data": firsts}
            for name in ("text", "text_pair")
        ]
        kserve = client.post(
            f"/v2/models/{CLASSIFIER}/infer", json={"inputs": tensors, "parameters": {"top_k": 1}}
        )
        assert kserve.status_code == 200, kserve.text[:300]
        over = client.post("/v1/rerank", json={"query": "a", "documents": [*docs, {"text": "x"}]})
        assert over.status_code == 400 and "1100" in over.json()["error"]["message"]
        padded = [{"text": f"d{i}", "x": "y"} for i in range(1100)]  # 4 strings a document: refused unparsed
        over = client.post("/v1/rerank", json={"query": "a", "documents": padded})
        assert over.status_code == 400 and "JSON strings" in over.json()["error"]["message"]


def test_a_body_over_max_message_bytes_is_413(limits_server):
    with httpx.Client(base_url=limits_server.http_url, timeout=60) as client:
        for path in ("/v1/rerank", "/v2/rerank", "/rerank", "/v1/score"):
            big = client.post(path, json={"query": "q", "documents": ["word " * 30_000]})
            assert big.status_code == 413, (path, big.status_code)
        assert client.post("/rerank", json={"query": "q", "texts": ["a"]}).status_code == 200
