"""JSON nested deeper than MAX_JSON_DEPTH is refused with 400 before it is parsed, on every route and on
both sides of OFF_LOOP_BYTES: what reads a body's values later (error messages included) never meets a
depth a client chose. Before the limit, a value nested 600 deep in a KServe field, or 985 deep in a body
parsed on the CPU pool, raised RecursionError in the message that named it: a 500 and a long traceback."""

from __future__ import annotations

import json

import httpx
import pytest

from bertserve.service.errors import InvalidInput, quote
from bertserve.service.http.json_body import MAX_JSON_DEPTH, OFF_LOOP_BYTES, check_counts
from tests.helpers.server import ServerThread


def nested(depth: int) -> list:
    value: list = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


def encoded(body: dict, padded: bool) -> bytes:
    """`body` as JSON; `padded`: with spaces past OFF_LOOP_BYTES, so it is parsed on the CPU pool."""
    data = json.dumps(body, separators=(",", ":")).encode()
    return data + b" " * (OFF_LOOP_BYTES + 1024) if padded else data


def test_depth_is_counted_outside_strings_up_to_the_limit():
    inside = {"inputs": ["a"], "x": nested(MAX_JSON_DEPTH - 1)}  # the body's own object is one level
    check_counts(json.dumps(inside).encode(), 256)
    with pytest.raises(InvalidInput, match=f"nested {MAX_JSON_DEPTH + 1} deep, more than {MAX_JSON_DEPTH}"):
        check_counts(json.dumps({"inputs": ["a"], "x": nested(MAX_JSON_DEPTH)}).encode(), 256)
    with pytest.raises(InvalidInput, match="nested 34 deep"):  # objects count as arrays do
        check_counts(json.dumps({"x": json.loads('{"a":' * 33 + "1" + "}" * 33)}).encode(), 256)
    texts = ["[" * 500 + '\\"{' * 100, "]" * 50]  # brackets and escaped quotes inside strings do not nest
    check_counts(json.dumps({"inputs": texts}).encode(), 256)


def test_a_quoted_value_stays_short_however_deep():
    assert len(quote(nested(5000))) < 64


@pytest.fixture(scope="module")
def server(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"]) as running:
        yield running


DEEP = 900  # past the parser's own recursion limit on the CPU pool, within it on the event loop at 600
# (route, a body with `value` in one of its fields): fields read by the route's own checks
ROUTES = {
    "kserve datatype": (
        "/v2/models/tiny-embed/infer",
        lambda value: {"inputs": [{"name": "text", "datatype": value, "shape": [1], "data": ["a"]}]},
    ),
    "kserve parameter": (
        "/v2/models/tiny-embed/infer",
        lambda value: {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
            "parameters": {"truncate": value},
        },
    ),
    "rerank relevant_spans": (
        "/v2/rerank",
        lambda value: {"query": "q", "documents": ["a"], "relevant_spans": {"mode": value}},
    ),
    "attention layers": ("/bertserve/v1/attention", lambda value: {"input": "a cat", "layers": value}),
    "openai input": ("/v1/embeddings", lambda value: {"input": value}),
}


@pytest.mark.parametrize("padded", [False, True], ids=["on the loop", "on the CPU pool"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_deeply_nested_field_is_a_400_on_every_route(server, route, padded):
    path, body = ROUTES[route]
    depth = DEEP if padded else 600
    reply = httpx.post(
        f"{server.http_url}{path}",
        content=encoded(body(nested(depth)), padded),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert reply.status_code == 400, reply.text[:300]
    assert f"more than {MAX_JSON_DEPTH}" in reply.text and len(reply.content) < 1024, reply.text[:300]
    assert httpx.get(f"{server.http_url}/ready", timeout=10).status_code == 200
