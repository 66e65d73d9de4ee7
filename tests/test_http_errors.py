"""Bad input, overload, deadlines and drain over HTTP: every case with its status code, its gRPC status name
and its message (a table looped over), against a real server; the server stays healthy."""

from __future__ import annotations

import asyncio
import json
import threading

import grpc
import httpx
import pytest

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc
from tests.helpers.server import ServerProcess, ServerThread, metric, scrape

EMBEDDINGS, EMBED, KSERVE = "/v1/embeddings", "/bertserve/v1/embed", "/v2/models/tiny-embed/infer"
JSON = {"content-type": "application/json"}


def text_tensor(data, **changes) -> dict:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(data)], "data": data, **changes}]}


# (id, method, path, body: dict/list -> JSON, bytes -> as is, headers, status, gRPC code, message part)
CASES = [
    ("not json", "POST", EMBEDDINGS, b'{"input": ', JSON, 400, "INVALID_ARGUMENT", "body: not valid JSON"),
    ("not utf-8", "POST", EMBEDDINGS, b'{"input": "\xff"}', JSON, 400, "INVALID_ARGUMENT", "not valid UTF-8"),
    ("nested", "POST", EMBEDDINGS, b'{"input": ' + b"[" * 1_200, JSON, 400, "INVALID_ARGUMENT", "nested"),
    (
        "brackets",
        "POST",
        EMBEDDINGS,
        b"[" * 100_000,
        JSON,
        400,
        "INVALID_ARGUMENT",
        "max_inputs_per_request 256",
    ),
    ("empty body", "POST", EMBEDDINGS, b"", JSON, 400, "INVALID_ARGUMENT", "body: empty"),
    ("not an object", "POST", EMBEDDINGS, ["a"], {}, 400, "INVALID_ARGUMENT", "must be a JSON object"),
    (
        "content type",
        "POST",
        EMBEDDINGS,
        b"input=a",
        {"content-type": "text/plain"},
        415,
        "INVALID_ARGUMENT",
        "content-type",
    ),
    (
        "gzip body",
        "POST",
        EMBEDDINGS,
        b"x",
        {**JSON, "content-encoding": "gzip"},
        415,
        "INVALID_ARGUMENT",
        "compressed",
    ),
    ("no input", "POST", EMBEDDINGS, {"model": "tiny-embed"}, {}, 400, "INVALID_ARGUMENT", "input: required"),
    (
        "input number",
        "POST",
        EMBEDDINGS,
        {"input": 3},
        {},
        400,
        "INVALID_ARGUMENT",
        "input: must be a string or",
    ),
    ("input empty", "POST", EMBEDDINGS, {"input": []}, {}, 400, "INVALID_ARGUMENT", "got an empty array"),
    (
        "token ids",
        "POST",
        EMBEDDINGS,
        {"input": [1, 100000]},
        {},
        400,
        "INVALID_ARGUMENT",
        "input[0][1]: 100000 is outside the vocabulary",
    ),
    (
        "item type",
        "POST",
        EMBEDDINGS,
        {"input": ["a", None]},
        {},
        400,
        "INVALID_ARGUMENT",
        "input[1]: must be a string",
    ),
    (
        "blank text",
        "POST",
        EMBEDDINGS,
        {"input": ["a", " "]},
        {},
        400,
        "INVALID_ARGUMENT",
        "input[1]: empty or whitespace-only",
    ),
    (
        "control",
        "POST",
        EMBEDDINGS,
        {"input": "a\x01"},
        {},
        400,
        "INVALID_ARGUMENT",
        "input[0]: control character U+0001",
    ),
    (
        "too many",
        "POST",
        EMBEDDINGS,
        {"input": ["a"] * 257},
        {},
        400,
        "INVALID_ARGUMENT",
        "max_inputs_per_request 256",
    ),
    (
        "too long",
        "POST",
        EMBEDDINGS,
        {"input": "a" * 20_001},
        {},
        400,
        "INVALID_ARGUMENT",
        "max_input_chars 20000",
    ),
    (
        "unknown model",
        "POST",
        EMBEDDINGS,
        {"input": "a", "model": "nope"},
        {},
        404,
        "NOT_FOUND",
        "no model named 'nope'",
    ),
    (
        "no task",
        "POST",
        "/bertserve/v1/fill-mask",
        {"inputs": ["a [MASK]"], "model": "tiny-embed"},
        {},
        422,
        "FAILED_PRECONDITION",
        "has no fill_mask task",
    ),
    (
        "encoding",
        "POST",
        EMBEDDINGS,
        {"input": "a", "encoding_format": "hex"},
        {},
        400,
        "INVALID_ARGUMENT",
        "encoding_format: must be one of",
    ),
    (
        "dimensions",
        "POST",
        EMBEDDINGS,
        {"input": "a", "dimensions": 8},
        {},
        400,
        "INVALID_ARGUMENT",
        "dimensions: 8 is not one of the model's dimensions",
    ),
    (
        "typo",
        "POST",
        EMBEDDINGS,
        {"input": "a", "normalise": True},
        {},
        400,
        "INVALID_ARGUMENT",
        "normalise: unknown field",
    ),
    (
        "timeout header",
        "POST",
        EMBEDDINGS,
        {"input": "a"},
        {"x-request-timeout": "soon"},
        400,
        "INVALID_ARGUMENT",
        "x-request-timeout: must be seconds",
    ),
    (
        "inputs type",
        "POST",
        EMBED,
        {"inputs": "a"},
        {},
        400,
        "INVALID_ARGUMENT",
        "inputs: must be an array of strings",
    ),
    (
        "normalize type",
        "POST",
        EMBED,
        {"inputs": ["a"], "normalize": "yes"},
        {},
        400,
        "INVALID_ARGUMENT",
        "normalize: must be true or false",
    ),
    (
        "no mask",
        "POST",
        "/bertserve/v1/fill-mask",
        {"inputs": ["a dog"]},
        {},
        400,
        "INVALID_ARGUMENT",
        "inputs[0]: no [MASK] token",
    ),
    (
        "top_k 0",
        "POST",
        "/bertserve/v1/classify",
        {"inputs": ["a"], "top_k": 0},
        {},
        400,
        "INVALID_ARGUMENT",
        "top_k: must be at least 1",
    ),
    (
        "top_k float",
        "POST",
        "/bertserve/v1/classify",
        {"inputs": ["a"], "top_k": 1.5},
        {},
        400,
        "INVALID_ARGUMENT",
        "top_k: must be an integer",
    ),
    (
        "layer",
        "POST",
        "/bertserve/v1/attention",
        {"input": "a", "layers": [99]},
        {},
        400,
        "INVALID_ARGUMENT",
        "layers[0]",
    ),
    (
        "no input",
        "POST",
        "/bertserve/v1/attention",
        {"layers": [0]},
        {},
        400,
        "INVALID_ARGUMENT",
        "input: required",
    ),
    ("no route", "GET", "/v1/nothing", None, {}, 404, "NOT_FOUND", "no route"),
    ("method", "GET", EMBEDDINGS, None, {}, 405, "UNIMPLEMENTED", "method GET is not allowed"),
    (
        "kserve model",
        "POST",
        "/v2/models/nope/infer",
        text_tensor(["a"]),
        {},
        404,
        "NOT_FOUND",
        "no model named 'nope'",
    ),
    (
        "kserve version",
        "POST",
        "/v2/models/tiny-embed/versions/7/infer",
        text_tensor(["a"]),
        {},
        404,
        "NOT_FOUND",
        "version '7'",
    ),
    (
        "kserve tensor",
        "POST",
        KSERVE,
        {"inputs": []},
        {},
        400,
        "INVALID_ARGUMENT",
        "expected exactly one input tensor 'text'",
    ),
    (
        "kserve type",
        "POST",
        KSERVE,
        text_tensor(["a"], datatype="FP32"),
        {},
        400,
        "INVALID_ARGUMENT",
        "datatype: must be BYTES",
    ),
    (
        "kserve count",
        "POST",
        KSERVE,
        text_tensor(["a"], shape=[2]),
        {},
        400,
        "INVALID_ARGUMENT",
        "needs 2 elements, got 1",
    ),
    (
        "kserve output",
        "POST",
        KSERVE,
        {**text_tensor(["a"]), "outputs": [{"name": "labels"}]},
        {},
        400,
        "INVALID_ARGUMENT",
        "has no output 'labels'",
    ),
    (
        "kserve param",
        "POST",
        KSERVE,
        {**text_tensor(["a"]), "parameters": {"normalize": 1}},
        {},
        400,
        "INVALID_ARGUMENT",
        "parameters['normalize']: must be true or false",
    ),
    (
        "kserve binary",
        "POST",
        KSERVE,
        json.dumps(text_tensor(["a"])).encode() + b"\x01",
        {"inference-header-content-length": "999999"},
        400,
        "INVALID_ARGUMENT",
        "inference-header-content-length",
    ),
]


@pytest.fixture(scope="module")
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.http_url, timeout=30) as client:
        yield client


def send(http: httpx.Client, method: str, path: str, body, headers: dict) -> httpx.Response:
    if isinstance(body, bytes):
        return http.request(method, path, content=body, headers=headers)
    return http.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "code", "message"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_bad_request_gets_its_status_and_message(http, method, path, body, headers, status, code, message):
    reply = send(http, method, path, body, headers)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    if path.startswith("/v2"):  # KServe's error body: {"error": "message"}
        assert message in error
    else:  # OpenAI's: {"error": {"message", "type", "param", "code"}}
        assert message in error["message"] and error["code"] == code, error
        assert error["type"] == "invalid_request_error"
    assert http.get("/health").status_code == 200


def test_refusals_are_counted_per_route_and_code(tiny_server, http):
    labels = {"rpc": "http:/v1/embeddings", "code": "INVALID_ARGUMENT"}
    before = metric(scrape(tiny_server.metrics_url), "bertserve_requests_total", **labels)
    assert http.post(EMBEDDINGS, json={"input": 3}).status_code == 400
    assert metric(scrape(tiny_server.metrics_url), "bertserve_requests_total", **labels) == before + 1


def test_full_queue_is_429_with_retry_after_and_deadline_is_504(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], max_queue_inputs=2) as server:
        reply = httpx.post(f"{server.http_url}{EMBEDDINGS}", json={"input": ["a", "b", "c"]}, timeout=30)
        assert reply.status_code == 429 and reply.headers["retry-after"] == "1"
        assert "max_queue_inputs 2" in reply.json()["error"]["message"]
        assert reply.json()["error"]["type"] == "rate_limit_error"
        core = server.server.core
        release = threading.Event()
        real_embed = core.embed

        async def held_embed(*args, **kwargs):  # holds the call past its deadline
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)
            return await real_embed(*args, **kwargs)

        core.embed = held_embed
        try:
            reply = httpx.post(
                f"{server.http_url}{EMBEDDINGS}",
                json={"input": "a"},
                headers={"x-request-timeout": "0.2"},
                timeout=30,
            )
        finally:
            release.set()
            core.embed = real_embed
        assert reply.status_code == 504 and reply.json()["error"]["code"] == "DEADLINE_EXCEEDED"
        assert (
            httpx.post(f"{server.http_url}{EMBEDDINGS}", json={"input": "a"}, timeout=30).status_code == 200
        )


def test_drain_over_http(tiny_repo):
    """Readiness false at once, new requests 503, the request in flight answered, then the listener closes."""
    entered, release = threading.Event(), threading.Event()
    server = ServerThread(model_repo=tiny_repo, models=["tiny-embed"], grace_period_s=20).start()
    try:
        url, core = server.http_url, server.server.core
        assert httpx.get(f"{url}/ready").json() == {"ready": True}
        real_embed = core.embed

        async def held_embed(*args, **kwargs):
            entered.set()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)
            return await real_embed(*args, **kwargs)

        core.embed = held_embed
        with httpx.Client(base_url=url, timeout=30) as keep_alive:
            assert keep_alive.get("/health").status_code == 200  # an idle keep-alive connection
            replies: list[httpx.Response] = []
            in_flight = threading.Thread(
                target=lambda: replies.append(
                    httpx.post(f"{url}{EMBEDDINGS}", json={"input": "a"}, timeout=30)
                )
            )
            in_flight.start()
            assert entered.wait(30)
            drained = asyncio.run_coroutine_threadsafe(server.server.drain(), server.loop)
            server.call(asyncio.sleep, 0)  # the drain's first step (stop accepting) has run
            assert httpx.get(f"{url}/ready").status_code == 503
            assert httpx.get(f"{url}/v2/health/ready").status_code == 503
            assert httpx.get(f"{url}/health").status_code == 200
            refused = httpx.post(f"{url}{EMBEDDINGS}", json={"input": "b"})
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "UNAVAILABLE"
            with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as over_grpc:
                inference_pb2_grpc.InferenceStub(channel).Embed(pb.EmbedRequest(inputs=["c"]), timeout=10)
            assert over_grpc.value.code() is grpc.StatusCode.UNAVAILABLE
            assert not replies
            release.set()
            in_flight.join(30)
            (answered,) = replies
            assert answered.status_code == 200 and answered.headers["connection"] == "close"
            assert drained.result(30) is True
            with pytest.raises(httpx.TransportError):
                keep_alive.get("/health")  # the server closed the idle connection, then stopped listening
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{url}/health")
    finally:
        release.set()
        server.stop()


def test_sigterm_drains_and_closes_http(tiny_repo):
    """`bertserve serve` on SIGTERM: HTTP answered until the drain, exit 0, then the HTTP port is closed."""
    server = ServerProcess(
        "--model-repo", str(tiny_repo), "--model", "tiny-embed", "--grace-period-s", "5"
    ).start()
    try:
        assert server.http_port is not None
        with httpx.Client(base_url=server.http_url, timeout=30) as client:
            assert client.post(EMBEDDINGS, json={"input": "a"}).status_code == 200
            assert server.terminate() == 0
            with pytest.raises(httpx.TransportError):
                client.get("/health")
        assert "every accepted call answered" in server.output
    finally:
        server.kill()
