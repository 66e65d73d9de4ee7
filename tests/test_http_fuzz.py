"""Bad JSON shapes over every HTTP route: each field of a valid body swapped for a value of the wrong kind
(array for string, object for number, nested arrays, huge and negative numbers, booleans, a lone
surrogate), bad numeric headers, NaN/Infinity literals and client values long enough to blow up an error
message. Every answer is below 500 and short, and nothing is logged as a crash."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from tests.helpers.server import metric, scrape

TEXT = "the cat sat"
JSON = {"content-type": "application/json"}
KSERVE_INFER = "/v2/models/tiny-classifier/infer"
# A valid body for each JSON route: every value in it (at any depth) is swapped in turn.
VALID = {
    "/v1/embeddings": {"input": [TEXT], "model": "tiny-embed", "encoding_format": "float", "truncate": False},
    "/bertserve/v1/embed": {"inputs": [TEXT], "model": "tiny-embed", "normalize": True, "truncate": False},
    "/bertserve/v1/fill-mask": {"inputs": ["the [MASK] sat"], "model": "tiny-mlm", "top_k": 2},
    "/bertserve/v1/classify": {"inputs": [TEXT], "model": "tiny-classifier", "top_k": 1, "raw_scores": True},
    "/bertserve/v1/tokenize": {"inputs": [TEXT], "model": "tiny-embed", "truncate": True},
    "/bertserve/v1/attention": {"input": TEXT, "model": "tiny-embed", "layers": [0], "heads": [1]},
    "/bertserve/v1/info": {},
    "/v2/repository/index": {"ready": True},
    KSERVE_INFER: {
        "id": "r1",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXT], "parameters": {}}],
        "outputs": [{"name": "labels", "parameters": {"binary_data": False}}],
        "parameters": {"top_k": 1, "truncate": False, "binary_data_output": False},
    },
}
WRONG = [
    ["x"],
    {"k": [1]},
    [[[[]]]],
    10**30,
    -(10**30),
    -1,
    True,
    0.5,
    1e308,
    "\ud800",
    "x",
    None,
]
MAX_ERROR_BYTES = 2048  # an error body never grows with what the client sent


def paths(value: object, prefix: tuple = ()) -> list[tuple]:
    """Every position in a JSON value: () is the value itself."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += paths(item, (*prefix, i))
    return found


def replaced(value: object, path: tuple, new: object) -> object:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replaced(value[path[0]], path[1:], new)
    return copy


def cases() -> list[tuple[str, tuple, object]]:
    return [(route, path, wrong) for route, body in VALID.items() for path in paths(body) for wrong in WRONG]


@pytest.fixture(scope="module")
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.http_url, timeout=60) as client:
        yield client


def crashes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def assert_answered(reply: httpx.Response, what: object) -> None:
    assert reply.status_code < 500, (what, reply.status_code, reply.text[:300])
    if reply.status_code >= 400:
        assert len(reply.content) <= MAX_ERROR_BYTES, (what, len(reply.content))
        assert reply.json()["error"], what


def test_valid_bodies_are_answered(http):
    for route, body in VALID.items():
        reply = http.post(route, json=body)
        assert reply.status_code == 200, (route, reply.text[:300])


def test_every_field_swapped_for_a_wrong_kind_is_a_4xx_and_no_crash(tiny_server, http, caplog):
    caplog.set_level(logging.ERROR)
    internal_before = metric(scrape(tiny_server.metrics_url), "bertserve_requests_total", code="INTERNAL")
    table = cases()
    refused = 0
    for route, path, wrong in table:
        body = json.dumps(replaced(VALID[route], path, wrong)).encode()  # "\ud800" as a JSON escape
        reply = http.post(route, content=body, headers=JSON)
        assert_answered(reply, (route, path, wrong))
        refused += reply.status_code >= 400
    assert refused > len(table) // 2  # most swaps are refused (some, e.g. a float top_k of 1.0, are fine)
    assert crashes(caplog) == []
    after = metric(scrape(tiny_server.metrics_url), "bertserve_requests_total", code="INTERNAL")
    assert after == internal_before


# (route, body, the field the 400 names)
SURROGATES = [
    ("/v1/embeddings", {"input": "\ud800"}, "input"),
    ("/v1/embeddings", {"input": ["ok", "a\udc00b"]}, "input[1]"),
    ("/v1/embeddings", {"input": "ok", "model": "\ud800"}, "model"),
    ("/bertserve/v1/embed", {"inputs": ["ok", "\ud800"]}, "inputs[1]"),
    ("/bertserve/v1/fill-mask", {"inputs": ["[MASK] \ud800"], "model": "tiny-mlm"}, "inputs[0]"),
    ("/bertserve/v1/classify", {"inputs": ["\ud800"], "model": "tiny-classifier"}, "inputs[0]"),
    ("/bertserve/v1/tokenize", {"inputs": ["\udfff"]}, "inputs[0]"),
    ("/bertserve/v1/attention", {"input": "x \ud800", "model": "tiny-embed"}, "input"),
    (
        KSERVE_INFER,
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["\ud800"]}]},
        "data[0]",
    ),
    (
        KSERVE_INFER,
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}], "id": "\ud800"},
        "id",
    ),
]


@pytest.mark.parametrize(("route", "body", "field"), SURROGATES, ids=[f"{c[0]} {c[2]}" for c in SURROGATES])
def test_lone_surrogate_is_400_naming_the_field(http, caplog, route, body, field):
    caplog.set_level(logging.ERROR)
    reply = http.post(route, content=json.dumps(body).encode(), headers=JSON)
    assert reply.status_code == 400, reply.text[:300]
    error = reply.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    assert "lone surrogate U+D" in message and field in message.split(":")[0], message
    assert crashes(caplog) == []


def kserve_body(**tensor) -> dict:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXT], **tensor}]}


# (headers, body, message part): numeric headers in other scripts' digits and other malformed numbers
HEADERS = [
    ({"inference-header-content-length": "\u00b2"}, kserve_body(), "inference-header-content-length"),
    ({"inference-header-content-length": "\u0663"}, kserve_body(), "inference-header-content-length"),
    ({"inference-header-content-length": "-1"}, kserve_body(), "inference-header-content-length"),
    ({"inference-header-content-length": "+5"}, kserve_body(), "inference-header-content-length"),
    ({"inference-header-content-length": "9" * 40}, kserve_body(), "inference-header-content-length"),
    ({"x-request-timeout": "\u00b2"}, kserve_body(), "x-request-timeout"),
    ({"x-request-timeout": "nan"}, kserve_body(), "x-request-timeout"),
    ({"x-request-timeout": "1e999"}, kserve_body(), "x-request-timeout"),
    ({"x-request-timeout": "-1"}, kserve_body(), "x-request-timeout"),
]


def wire(value: str) -> bytes:
    """A header value's bytes: Latin-1 where it can be (as the server reads headers), else UTF-8."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode()


@pytest.mark.parametrize(("headers", "body", "message"), HEADERS, ids=[repr(h) for h, _, _ in HEADERS])
def test_bad_numeric_headers_are_400(http, caplog, headers, body, message):
    caplog.set_level(logging.ERROR)
    data = json.dumps(body).encode()
    raw = {name: wire(value) for name, value in headers.items()}
    reply = http.post(KSERVE_INFER, content=data, headers={**JSON, **raw})
    assert reply.status_code == 400, reply.text[:300]
    assert message in reply.json()["error"] and len(reply.content) <= MAX_ERROR_BYTES
    assert crashes(caplog) == []


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
@pytest.mark.parametrize(
    ("route", "template"),
    [
        ("/v1/embeddings", '{"input": "a", "dimensions": %s}'),
        ("/bertserve/v1/classify", '{"inputs": ["a"], "model": "tiny-classifier", "top_k": %s}'),
        (
            KSERVE_INFER,
            '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}], '
            '"parameters": {"top_k": %s}}',
        ),
    ],
)
def test_nan_and_infinity_literals_are_refused(http, route, template, literal):
    reply = http.post(route, content=(template % literal).encode(), headers=JSON)
    assert reply.status_code == 400, reply.text[:300]
    text = reply.text
    assert "not a JSON number" in text or "range of a 64-bit float" in text, text


def test_kserve_outputs_name_of_the_wrong_kind_is_400(http):
    for name in (["embedding"], {"a": 1}, 3):
        reply = http.post(KSERVE_INFER, json={**kserve_body(), "outputs": [{"name": name}]})
        assert reply.status_code == 400 and "outputs[0].name" in reply.json()["error"], reply.text[:300]


LONG = "n" * 3_000_000


@pytest.mark.parametrize(
    ("route", "body"),
    [
        (KSERVE_INFER, {"inputs": [{"name": LONG, "datatype": "BYTES", "shape": [1], "data": ["a"]}]}),
        (KSERVE_INFER, kserve_body(datatype=LONG)),
        (KSERVE_INFER, kserve_body(shape=[LONG])),
        (KSERVE_INFER, {**kserve_body(), "outputs": [{"name": LONG}]}),
        (KSERVE_INFER, {**kserve_body(), "parameters": {"top_k": LONG}}),
        (KSERVE_INFER, kserve_body(parameters={"binary_data_size": LONG})),
        ("/v1/embeddings", {"input": "a", LONG: 1}),
        ("/v1/embeddings", {"input": "a", "model": LONG}),
        ("/v1/embeddings", {"input": "a", "encoding_format": LONG}),
        ("/bertserve/v1/attention", {"input": "a", "model": "tiny-embed", "layers": [LONG]}),
        ("/bertserve/v1/attention", {"input": "a", "model": "tiny-embed", "layers": [10**4000]}),
    ],
    ids=[
        "kserve input name",
        "datatype",
        "shape",
        "output name",
        "parameter",
        "binary size",
        "field name",
        "model",
        "encoding",
        "layers",
        "4001-digit layer",
    ],
)
def test_long_client_values_are_shortened_in_errors(http, route, body):
    reply = http.post(route, content=json.dumps(body).encode(), headers=JSON)
    assert 400 <= reply.status_code < 500, reply.text[:300]
    assert len(reply.content) <= MAX_ERROR_BYTES, reply.text[:300]
