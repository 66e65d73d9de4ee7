"""Bad embedding options over HTTP: each gets 400 naming its JSON field (never a 500) and the server stays
healthy; a token-level answer too large for max_message_bytes in JSON is refused before the encoder runs."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.embedding_models import MLM_MODEL, ST_MODEL
from tests.helpers.server import ServerThread

MAX_MESSAGE_BYTES = 64 * 1024
MAX_INPUTS = 32
ST = {"model": ST_MODEL}
BAD = [  # (path, body, the field the message names)
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "dimensions": 100}, "dimensions"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "dimensions": "8"}, "dimensions"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "dimensions": 0}, "dimensions"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "prompt_name": "nope"}, "prompt_name"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "prompt_name": 5}, "prompt_name"),
    (
        "/bertserve/v1/embed",
        {**ST, "inputs": ["a"], "truncation_direction": "middle"},
        "truncation_direction",
    ),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "encodings": ["int4"]}, "encodings[0]"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "encodings": "int8"}, "encodings"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "encodings": ["int8", "int8"]}, "encodings"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "sparse": True}, "sparse"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "tokens": "yes"}, "tokens"),
    (
        "/bertserve/v1/embed",
        {"model": MLM_MODEL, "inputs": ["a"], "sparse": True, "sparse_threshold": "x"},
        "sparse_threshold",
    ),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "chunking": 5}, "chunking"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "chunking": {"length": 2}}, "chunking.length"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "chunking": {"overlap": -1}}, "chunking.overlap"),
    (
        "/bertserve/v1/embed",
        {**ST, "inputs": ["a"], "chunking": {"length": 8, "overlap": 6}},
        "chunking.overlap",
    ),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "chunking": {"pooling": "median"}}, "chunking.pooling"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "chunking": {"size": 3}}, "chunking.size"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "dense": False}, "dense"),
    (
        "/bertserve/v1/embed",
        {**ST, "inputs": ["a"], "tokens": True, "dense": False, "encodings": ["int8"]},
        "encodings",
    ),
    (
        "/bertserve/v1/embed",
        {"model": MLM_MODEL, "inputs": ["a"], "sparse": True, "sparse_threshold": -1},
        "sparse_threshold",
    ),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a"], "tokens": True, "chunking": {}}, "chunking"),
    ("/bertserve/v1/embed", {**ST, "inputs": ["a " * 100], "chunking": {"length": 3}}, "chunking"),
    ("/bertserve/v1/embed", {**ST, "token_ids": [[]]}, "token_ids[0]"),
    ("/bertserve/v1/embed", {**ST, "token_ids": [[2, -1]]}, "token_ids[0][1]"),
    ("/bertserve/v1/embed", {**ST, "token_ids": [[2, 3], [2, 99999]]}, "token_ids[1][1]"),
    ("/bertserve/v1/embed", {**ST, "token_ids": [[2.5]]}, "token_ids[0][0]"),
    ("/bertserve/v1/embed", {**ST, "token_ids": [["a"]]}, "token_ids[0][0]"),
    ("/bertserve/v1/embed", {**ST, "token_ids": [2, 3]}, "token_ids[0]"),
    ("/bertserve/v1/embed", {**ST, "token_ids": [[2, 3]], "inputs": ["a"]}, "token_ids"),
    ("/bertserve/v1/embed", {**ST, "token_ids": [[2, 3]], "prompt_name": "query"}, "prompt_name"),
    ("/bertserve/v1/embed", {**ST}, "inputs"),
    ("/embed", {"inputs": [1, "a"]}, "inputs[1]"),
    ("/embed", {"inputs": [[2, 3], "a"]}, "inputs[1]"),
    ("/embed", {"inputs": [[2, 3], [2, 99999]]}, "inputs[1][1]"),
    ("/embed", {"inputs": {"text": "a"}}, "inputs"),
    ("/embed", {"inputs": "a", "truncation_direction": "up"}, "truncation_direction"),
    ("/embed", {"inputs": "a", "dimensions": 7}, "dimensions"),
    ("/embed", {"inputs": "a", "normalize": "yes"}, "normalize"),
    ("/embed_all", {"inputs": "a", "dimensions": 8}, "dimensions"),
    ("/embed_sparse", {"inputs": "a", "model": ST_MODEL}, "sparse"),
    ("/embed_sparse", {"inputs": "a", "sparse_threshold": [1]}, "sparse_threshold"),
    ("/v1/embeddings", {"input": [[2, 3], [99999]]}, "input[1][0]"),
    ("/v1/embeddings", {"input": ["a"], "dimensions": 7}, "dimensions"),
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": ["a"], "encoding_format": "int8"}, "encoding_format"),
    ("/v2/embed", {**ST, "texts": ["a"], "embedding_types": ["float16"]}, "embedding_types[0]"),
    ("/v2/embed", {**ST, "texts": ["a"], "truncate": "MIDDLE"}, "truncate"),
    ("/v2/embed", {**ST, "texts": ["a"], "output_dimension": 7}, "output_dimension"),
    ("/v2/embed", {**ST, "texts": ["a"], "input_type": "classification"}, "input_type"),
    ("/v2/embed", {**ST, "texts": ["a"], "images": ["data:image/png;base64,AA=="]}, "images"),
    ("/v2/embed", {**ST, "texts": ["a"], "max_tokens": 8}, "max_tokens"),
    ("/v2/embed", {**ST, "input_type": "search_query"}, "texts"),
]


@pytest.fixture(scope="module")
def server(st_repo):
    with ServerThread(
        model_repo=st_repo,
        max_queue_delay_ms=5,
        max_message_bytes=MAX_MESSAGE_BYTES,
        max_inputs_per_request=MAX_INPUTS,
    ) as server:
        yield server


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.http_url, timeout=60) as client:
        yield client


@pytest.mark.parametrize(("path", "body", "field"), BAD, ids=[f"{p}:{f}" for p, _, f in BAD])
def test_bad_option_is_400_naming_the_field(http, path, body, field):
    response = http.post(path, json=body)
    assert response.status_code == 400, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error["code"] == "INVALID_ARGUMENT"
    assert error["message"].startswith(f"{field}:") or error["param"] == field, error["message"]
    healthy = http.post("/embed", json={"inputs": "still serving"})
    assert healthy.status_code == 200 and len(healthy.json()[0]) == 48


def batches(server) -> float:
    text = httpx.get(server.metrics_url, timeout=30).text
    found = re.search(rf'^bertserve_batch_size_count{{model="{ST_MODEL}"}} (\S+)$', text, re.M)
    return float(found[1]) if found else 0.0


def test_token_level_json_over_max_message_bytes_is_refused_before_compute(server, http):
    """3 inputs of 64 tokens x 48 floats: 37 KB as protobuf floats (under the limit), about 180 KB of JSON."""
    long = "the cat sat on the mat " * 20
    before = batches(server)
    for path, body in (
        ("/embed_all", {"inputs": [long] * 3, "truncate": True}),
        ("/bertserve/v1/embed", {**ST, "inputs": [long] * 3, "truncate": True, "tokens": True}),
    ):
        response = http.post(path, json=body)
        assert response.status_code == 400, response.text[:300]
        message = response.json()["error"]["message"]
        assert message.startswith("tokens:") and "max_message_bytes 65536" in message, message
    assert batches(server) == before  # no encoder batch ran
    small = http.post("/embed_all", json={"inputs": ["a cat"]})
    assert small.status_code == 200 and len(small.json()[0][0]) == 48


def test_token_id_bodies_hold_max_length_ids_per_input(http):
    """The parser's count of JSON values allows max_length ids per input (not two values, as for texts),
    and no more: a body of longer lists is refused before it is parsed."""
    full = [[2] + [7] * 62 + [3]] * MAX_INPUTS  # max_length 64 ids each
    for path, body in (
        ("/bertserve/v1/embed", {**ST, "token_ids": full}),
        ("/v1/embeddings", {**ST, "input": full}),
        ("/embed", {**ST, "inputs": full}),
    ):
        response = http.post(path, json=body)
        assert response.status_code == 200, (path, response.text[:300])
    over = http.post("/embed", json={**ST, "inputs": [[7] * 200] * MAX_INPUTS, "truncate": True})
    assert over.status_code == 400 and "JSON values" in over.json()["error"]["message"]


def test_sparse_json_over_max_message_bytes_is_refused_before_it_is_built(http):
    """The core bounds a sparse answer at 8 bytes an entry (protobuf); its JSON takes several times that:
    an answer whose JSON would pass max_message_bytes is refused naming sparse, not built and measured."""
    texts = [f"the cat number {i} sat on the mat" for i in range(6)]
    for path, body in (
        ("/embed_sparse", {"inputs": texts, "model": MLM_MODEL}),
        ("/bertserve/v1/embed", {"model": MLM_MODEL, "inputs": texts, "sparse": True}),
    ):
        response = http.post(path, json=body)
        assert response.status_code == 400, (path, response.status_code, response.text[:300])
        message = response.json()["error"]["message"]
        assert message.startswith("sparse:") and "max_message_bytes 65536" in message, message
    small = http.post("/embed_sparse", json={"inputs": ["a cat"], "model": MLM_MODEL})
    assert small.status_code == 200 and small.json()[0], small.text[:300]
