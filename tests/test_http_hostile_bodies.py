"""Hostile HTTP bodies: millions of tiny JSON values or zero-length binary tensor elements are refused for
their counts before they are decoded (and large bodies are decoded off the event loop), so gRPC health
checks and unary calls stay fast while they arrive; an HTTP attention reply too large for its JSON is
refused before it is computed."""

from __future__ import annotations

import json
import struct
import threading
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertserve.service.errors import InvalidInput
from bertserve.service.http import json_body
from bertserve.service.kserve.tensors import decode_bytes_elements
from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc
from tests.helpers.server import ServerThread, metric, scrape

ELEMENTS = 2_000_000  # in a body just under the default max_message_bytes (8 MiB)
ROUNDS = 3  # bodies each hostile sender posts


def kserve_binary(shape_count: int) -> tuple[bytes, dict]:
    """A KServe infer body whose binary data holds ELEMENTS zero-length BYTES elements."""
    binary = struct.pack("<I", 0) * ELEMENTS
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [shape_count],
                    "parameters": {"binary_data_size": len(binary)},
                }
            ]
        }
    ).encode()
    headers = {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(header)),
    }
    return header + binary, headers


def json_post(value: object) -> tuple[bytes, dict]:
    return json.dumps(value, separators=(",", ":")).encode(), {"content-type": "application/json"}


# (path, body and headers, a part of the 400's message)
HOSTILE = {
    "kserve binary, shape [1]": (
        "/v2/models/tiny-embed/infer",
        kserve_binary(1),
        "more than the 1 elements its shape declares",
    ),
    "kserve binary, shape [256]": (
        "/v2/models/tiny-embed/infer",
        kserve_binary(256),
        "more than the 256 elements its shape declares",
    ),
    "kserve binary, shape [2M]": (
        "/v2/models/tiny-embed/infer",
        kserve_binary(ELEMENTS),
        "max_inputs_per_request 256",
    ),
    "openai, 2M strings": (
        "/v1/embeddings",
        json_post({"input": ["a"] * ELEMENTS}),
        "max_inputs_per_request 256",
    ),
    "kserve json, 2M strings": (
        "/v2/models/tiny-embed/infer",
        json_post({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [""] * ELEMENTS}]}),
        "max_inputs_per_request 256",
    ),
    "bertserve, 2.6M arrays": (
        "/bertserve/v1/embed",
        json_post({"inputs": [[]] * 2_600_000}),
        "max_inputs_per_request 256",
    ),
}


@pytest.fixture(scope="module")
def server(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"]) as running:
        yield running


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_body_is_refused_naming_the_limit(server, kind):
    path, (body, headers), message = HOSTILE[kind]
    assert len(body) <= server.settings.max_message_bytes
    reply = httpx.post(f"{server.http_url}{path}", content=body, headers=headers, timeout=120)
    assert reply.status_code == 400, reply.text[:300]
    assert message in reply.text and len(reply.content) < 1024, reply.text[:300]


def test_grpc_stays_fast_while_hostile_bodies_arrive(server):
    """Four clients post 8 MB bodies of millions of tiny elements, one after another; meanwhile gRPC
    health Check and unary Embed calls keep their usual latency (each body used to hold the event loop
    for about a second while it was decoded)."""
    kinds = [
        "kserve binary, shape [1]",
        "kserve binary, shape [256]",
        "openai, 2M strings",
        "bertserve, 2.6M arrays",
    ]
    statuses: list[int] = []
    failures: list[BaseException] = []

    def send(kind: str) -> None:
        path, (body, headers), _ = HOSTILE[kind]
        try:
            with httpx.Client(base_url=server.http_url, timeout=120) as client:
                for _ in range(ROUNDS):
                    statuses.append(client.post(path, content=body, headers=headers).status_code)
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    senders = [threading.Thread(target=send, args=(kind,)) for kind in kinds]
    health_s, embed_s = [], []
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        inference = inference_pb2_grpc.InferenceStub(channel)
        inference.Embed(pb.EmbedRequest(inputs=["warm"]), timeout=30)
        for sender in senders:
            sender.start()
        while any(sender.is_alive() for sender in senders):
            started = time.perf_counter()
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=60).status == 1  # SERVING
            health_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            inference.Embed(pb.EmbedRequest(inputs=["a short text"]), timeout=60)
            embed_s.append(time.perf_counter() - started)
    for sender in senders:
        sender.join()
    assert not failures, failures
    assert statuses == [400] * (len(kinds) * ROUNDS)
    assert len(health_s) >= 5, "the hostile bodies were answered before any check ran"
    # Each body used to hold the event loop for seconds (a check waited up to 7 s, an Embed 19 s); now
    # all but the slowest call (which one stall of a shared machine's scheduler may hold up) stay far
    # below these bounds.
    assert sorted(health_s)[-2] < 1.5, sorted(health_s)[-5:]
    assert sorted(embed_s)[-2] < 3.0, sorted(embed_s)[-5:]


def test_http_attention_too_large_for_json_is_refused_before_compute(tiny_repo):
    """All maps of a 72-token input fit a 256 KiB gRPC reply (4 bytes a probability) but not its JSON
    (about 20): HTTP refuses it before running the graph, with what the route offers instead."""
    text = " ".join(["cat"] * 70)
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], max_message_bytes=256 * 1024) as server:
        attention = {"rpc": "http:/bertserve/v1/attention"}
        computed = metric(scrape(server.metrics_url), "bertserve_inputs_total", task="attention")
        reply = httpx.post(
            f"{server.http_url}/bertserve/v1/attention",
            json={"input": text, "model": "tiny-embed"},
            timeout=60,
        )
        assert reply.status_code == 400, reply.text[:300]
        message = reply.json()["error"]["message"]
        assert "max_message_bytes 262144" in message and "fewer layers or heads" in message, message
        assert "encoding_format" not in message
        samples = scrape(server.metrics_url)
        assert metric(samples, "bertserve_inputs_total", task="attention") == computed  # nothing computed
        assert metric(samples, "bertserve_requests_total", code="INVALID_ARGUMENT", **attention) == 1
        # one layer's maps fit, and gRPC (4 bytes a probability) takes all of them
        one = httpx.post(
            f"{server.http_url}/bertserve/v1/attention",
            json={"input": text, "model": "tiny-embed", "layers": [0], "heads": [0]},
            timeout=60,
        )
        assert one.status_code == 200 and one.json()["sequence_length"] == 72
        with grpc.insecure_channel(server.address) as channel:
            maps = inference_pb2_grpc.InferenceStub(channel).Attention(
                pb.AttentionRequest(input=text, model="tiny-embed"), timeout=60
            )
        assert len(maps.maps) == 6


def test_large_bodies_are_decoded_off_the_event_loop(server, monkeypatch):
    """A body over 64 KiB is parsed on the CPU pool, a small one on the loop (where the hop costs more)."""
    threads: list[str] = []
    real = json_body.check_counts

    def spy(*args):  # the real check, noting the thread it runs on
        threads.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(json_body, "check_counts", spy)
    with httpx.Client(base_url=server.http_url, timeout=60) as client:
        small = client.post("/v1/embeddings", json={"input": "a"})
        large = client.post("/v1/embeddings", json={"input": ["word " * 4000] * 8, "truncate": True})
        kserve = client.post(
            "/v2/models/tiny-embed/infer",
            json={
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [4], "data": ["word " * 4000] * 4}]
            },
        )
    assert small.status_code == 200 and large.status_code == 200, large.text[:300]
    assert kserve.status_code == 400 and "max_length" in kserve.text  # parsed first, then refused
    loop_thread = server._thread.name
    assert threads[0] == loop_thread
    assert loop_thread not in threads[1:] and all(name.startswith("bertserve-cpu") for name in threads[1:])


def test_grpc_kserve_binary_elements_are_bounded_by_the_shape():
    """The gRPC KServe service shares the decoding: it stops at the element past the shape's count."""
    raw = struct.pack("<I", 0) * ELEMENTS
    with pytest.raises(InvalidInput, match="more than the 1 elements its shape declares"):
        decode_bytes_elements(raw, "raw_input_contents[0]", 1)
    assert decode_bytes_elements(struct.pack("<I", 1) + b"a", "raw", 1) == [b"a"]
