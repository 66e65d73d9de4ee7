"""The KServe v2 / Open Inference Protocol endpoint, tested with Triton's own client (tritonclient) against
a real server on 127.0.0.1 (port 0) serving the tiny repository.

tritonclient runs in a spawned child (see tests/helpers/triton_client.py): its generated code and
bertserve.kserve define the same protobuf package and cannot share a process.
"""

from __future__ import annotations

import asyncio
import struct
import threading

import grpc
import numpy as np
import pytest
import torch
from google.protobuf import descriptor_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from bertserve import protogen
from bertserve.kserve import open_inference_pb2 as pb
from bertserve.kserve import open_inference_pb2_grpc as pb_grpc
from bertserve.service.errors import InvalidInput
from bertserve.service.kserve.tensors import decode_bytes_elements, encode_bytes_elements
from bertserve.service.settings import Settings
from bertserve.service.supervisor.server import InferenceServer
from bertserve.v1 import inference_pb2 as v1
from bertserve.v1 import inference_pb2_grpc as v1_grpc
from tests.helpers import triton_client as triton
from tests.helpers.checkpoints import load_reference

TEXTS = ["the cat sat on the mat", "a dog", "paris is the capital of a dog and a cat"]
MAX_INPUTS = 8
# In the Open Inference Protocol's proto but not in Triton's (which ignores it on the wire).
OIP_ONLY_FIELDS = {".ModelMetadataResponse": {"properties"}}


class ServerThread:
    """An InferenceServer on its own event loop in a background thread."""

    def __init__(self, settings: Settings):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server: InferenceServer = self.run(self._start(settings))
        self.address = f"127.0.0.1:{self.server.port}"

    @staticmethod
    async def _start(settings: Settings) -> InferenceServer:
        server = InferenceServer(settings)
        await server.start()
        return server

    def run(self, coroutine, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def metric(self, name: str, **labels) -> float:
        return self.server.metrics.registry.get_sample_value(name, labels) or 0.0


def start(repo, **overrides) -> ServerThread:
    return ServerThread(Settings(model_repo=repo, host="127.0.0.1", port=0, metrics_port=-1, **overrides))


@pytest.fixture(scope="module")
def server(tiny_repo):
    running = start(tiny_repo, max_inputs_per_request=MAX_INPUTS)
    yield running
    running.close()


@pytest.fixture(scope="module")
def client():
    with triton.child() as worker:
        yield lambda fn, *args, **kwargs: worker.submit(fn, *args, **kwargs).result(60)


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel), v1_grpc.InferenceStub(channel)


def texts_tensor(texts: list[str]) -> np.ndarray:
    return np.array([t.encode() for t in texts], dtype=object)


def raw_bytes(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


@given(st.lists(st.binary(max_size=300), max_size=20))
@settings(max_examples=50, deadline=None)
def test_bytes_elements_round_trip(elements):
    encoded = encode_bytes_elements(elements)
    assert encoded == raw_bytes(elements)  # Triton's layout: uint32 little-endian length, then the bytes
    assert decode_bytes_elements(encoded, "raw") == elements
    if elements and elements[-1]:
        with pytest.raises(InvalidInput, match="remain"):
            decode_bytes_elements(encoded[:-1], "raw")


def test_generated_code_is_fresh():
    assert protogen.differences(package_dir=protogen.KSERVE_PACKAGE_DIR) == []


def test_proto_matches_tritonclients_on_the_wire(client):
    """Every message, field (number, type, label) and RPC of ours exists identically in Triton's proto."""
    theirs = descriptor_pb2.FileDescriptorProto.FromString(client(triton.protocol_descriptor))
    ours = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    assert ours.package == theirs.package == "inference"

    def messages(prefix, protos):
        for message in protos:
            name = f"{prefix}.{message.name}"
            yield name, {f.name: (f.number, f.type, f.label, f.type_name) for f in message.field}
            yield from messages(name, message.nested_type)

    their_messages = dict(messages("", theirs.message_type))
    for name, fields in messages("", ours.message_type):
        if name == ".ModelMetadataResponse.PropertiesEntry":
            continue
        shared = {k: v for k, v in fields.items() if k not in OIP_ONLY_FIELDS.get(name, ())}
        assert shared == their_messages[name], name
    their_methods = {m.name: (m.input_type, m.output_type) for m in theirs.service[0].method}
    (service,) = ours.service
    assert service.name == theirs.service[0].name == "GRPCInferenceService"
    for method in service.method:
        assert their_methods[method.name] == (method.input_type, method.output_type)


def test_probes_and_metadata(server, client):
    state = client(triton.probes, server.address, ["tiny-embed", "tiny-classifier", "no-such-model"])
    assert state == {
        "live": True,
        "ready": True,
        "models": {"tiny-embed": True, "tiny-classifier": True, "no-such-model": False},
    }
    about = client(triton.metadata, server.address)
    assert about["name"] == "bertserve" and about["version"]

    embed = client(triton.metadata, server.address, "tiny-embed")
    assert embed["versions"] == ["1"]
    assert embed["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]
    assert embed["outputs"][0] == {"name": "embedding", "datatype": "FP32", "shape": ["-1", "48"]}
    embed_outputs = [o["name"] for o in embed["outputs"]]  # docs/kserve.md, embedding options
    assert embed_outputs[-2:] == ["token_embeddings", "token_lengths"]
    assert {"embedding_float16", "embedding_binary", "embedding_ubinary"} <= set(embed_outputs)
    classifier = client(triton.metadata, server.address, "tiny-classifier")
    assert [o["name"] for o in classifier["outputs"]] == [*embed_outputs, "labels", "label_scores"]
    mlm = client(triton.metadata, server.address, "tiny-mlm")
    sparse = ["sparse_indices", "sparse_values", "sparse_lengths"]
    masks = ["mask_tokens", "mask_scores", "mask_sequences"]
    assert [o["name"] for o in mlm["outputs"]] == [*embed_outputs, *sparse, *masks]
    assert client(triton.metadata, server.address, "no-such-model")[0] == "NOT_FOUND"

    index = client(triton.repository_index, server.address)
    assert {(m["name"], m["version"], m["state"]) for m in index["models"]} == {
        (name, "1", "READY") for name in ("tiny-embed", "tiny-mlm", "tiny-classifier")
    }


def test_embeddings_equal_bertserve_v1_and_transformers(server, client, stub, make_tiny_checkpoint):
    inputs_before = server.metric("bertserve_inputs_total", model="tiny-embed", task="embed")
    answers = {}
    for normalize in (True, False):
        result = client(
            triton.infer,
            server.address,
            "tiny-embed",
            texts_tensor(TEXTS),
            parameters={"normalize": normalize},
            request_id=f"call-{normalize}",
        )
        assert result["id"] == f"call-{normalize}" and result["model_version"] == "1"
        answers[normalize] = result["outputs"]["embedding"]
        assert answers[normalize].dtype == np.float32 and answers[normalize].shape == (len(TEXTS), 48)

        _, inference = stub
        expected = inference.Embed(v1.EmbedRequest(inputs=TEXTS, model="tiny-embed", normalize=normalize))
        v1_vectors = np.array([e.values for e in expected.embeddings], dtype=np.float32)
        assert np.abs(answers[normalize] - v1_vectors).max() <= 1e-5
    # Both protocols' inputs went through the model's batcher and were counted there.
    assert server.metric(
        "bertserve_inputs_total", model="tiny-embed", task="embed"
    ) == inputs_before + 4 * len(TEXTS)

    from transformers import AutoTokenizer

    checkpoint = make_tiny_checkpoint("BertModel")
    tokens = AutoTokenizer.from_pretrained(checkpoint)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = load_reference(checkpoint)(**tokens).last_hidden_state.numpy()  # (B, T, H)
    mask = tokens["attention_mask"].numpy()[..., None].astype(np.float32)  # (B, T, 1)
    mean = (hidden * mask).sum(1) / mask.sum(1)  # (B, H)
    assert np.abs(answers[False] - mean).max() <= 1e-4
    unit = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    assert np.abs(answers[True] - unit).max() <= 1e-4  # the model's default: normalized


def test_classifier_outputs_equal_bertserve_v1(server, client, stub):
    result = client(
        triton.infer,
        server.address,
        "tiny-classifier",
        texts_tensor(TEXTS),
        outputs=["labels", "label_scores"],
        parameters={"top_k": 2},
    )
    assert set(result["outputs"]) == {"labels", "label_scores"}
    _, inference = stub
    expected = inference.Classify(v1.ClassifyRequest(inputs=TEXTS, model="tiny-classifier", top_k=2))
    for labels, scores, answer in zip(
        result["outputs"]["labels"], result["outputs"]["label_scores"], expected.results, strict=True
    ):
        assert [label.decode() for label in labels] == [s.label for s in answer.labels]
        assert np.allclose(scores, [s.score for s in answer.labels], atol=1e-6)


def test_fill_mask_outputs_equal_bertserve_v1(server, client, stub):
    masked = ["the cat sat on the [MASK]", "paris is the [MASK] of a dog"]
    outputs = ["mask_tokens", "mask_scores", "mask_sequences"]
    result = client(
        triton.infer,
        server.address,
        "tiny-mlm",
        texts_tensor(masked),
        outputs=outputs,
        parameters={"top_k": 3},
    )
    _, inference = stub
    expected = inference.FillMask(v1.FillMaskRequest(inputs=masked, model="tiny-mlm", top_k=3))
    got = result["outputs"]
    assert got["mask_tokens"].shape == got["mask_sequences"].shape == got["mask_scores"].shape == (2, 3)
    for tokens, scores, sequences, answer in zip(
        got["mask_tokens"], got["mask_scores"], got["mask_sequences"], expected.results, strict=True
    ):
        (mask,) = answer.masks
        assert [t.decode() for t in tokens] == [c.token for c in mask.candidates]
        assert [s.decode() for s in sequences] == [c.sequence for c in mask.candidates]
        assert np.allclose(scores, [c.score for c in mask.candidates], atol=1e-6)

    two_masks = client(
        triton.infer, server.address, "tiny-mlm", texts_tensor(["[MASK] cat [MASK]"]), outputs=outputs
    )
    assert two_masks[0] == "INVALID_ARGUMENT" and "exactly one" in two_masks[1]
    default = client(triton.infer, server.address, "tiny-mlm", texts_tensor(TEXTS))  # no mask needed
    assert list(default["outputs"]) == ["embedding"]


def test_typed_contents_request_gets_typed_outputs(server, stub):
    """bytes_contents in -> fp32_contents out; raw_input_contents in -> raw_output_contents out."""
    kserve, _ = stub
    tensor = pb.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[len(TEXTS), 1])
    typed = pb.ModelInferRequest(model_name="tiny-embed", inputs=[tensor])
    typed.inputs[0].contents.bytes_contents.extend(t.encode() for t in TEXTS)
    answer = kserve.ModelInfer(typed)
    assert not answer.raw_output_contents
    (output,) = answer.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("embedding", "FP32", [len(TEXTS), 48])
    typed_values = np.array(output.contents.fp32_contents, dtype=np.float32).reshape(len(TEXTS), 48)

    raw = pb.ModelInferRequest(model_name="tiny-embed", inputs=[tensor])
    raw.raw_input_contents.append(raw_bytes([t.encode() for t in TEXTS]))
    answer = kserve.ModelInfer(raw)
    assert not answer.outputs[0].HasField("contents")
    raw_values = np.frombuffer(answer.raw_output_contents[0], dtype="<f4").reshape(len(TEXTS), 48)
    assert np.abs(typed_values - raw_values).max() <= 1e-6


def _code(call, request) -> tuple[str, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call(request)
    return caught.value.code().name, caught.value.details()


def test_bad_requests_get_the_right_status_and_the_server_stays_healthy(server, client, stub):
    failed_before = server.metric("bertserve_requests_total", rpc="ModelInfer", code="INVALID_ARGUMENT")
    wrong_type = client(triton.infer, server.address, "tiny-embed", np.array([1, 2], dtype=np.int64), "INT64")
    assert wrong_type[0] == "INVALID_ARGUMENT" and "BYTES" in wrong_type[1]
    missing = client(triton.infer, server.address, "tiny-embed", texts_tensor(TEXTS), input_name="sentence")
    assert missing[0] == "INVALID_ARGUMENT" and "'text'" in missing[1]
    unknown = client(triton.infer, server.address, "no-such-model", texts_tensor(TEXTS))
    assert unknown[0] == "NOT_FOUND" and "no-such-model" in unknown[1]
    too_many = client(triton.infer, server.address, "tiny-embed", texts_tensor(["a dog"] * (MAX_INPUTS + 1)))
    assert too_many[0] == "INVALID_ARGUMENT" and f"max_inputs_per_request {MAX_INPUTS}" in too_many[1]
    no_output = client(triton.infer, server.address, "tiny-embed", texts_tensor(TEXTS), outputs=["labels"])
    assert no_output[0] == "INVALID_ARGUMENT" and "labels" in no_output[1]
    bad_parameter = client(
        triton.infer, server.address, "tiny-embed", texts_tensor(TEXTS), parameters={"normalize": "yes"}
    )
    assert bad_parameter[0] == "INVALID_ARGUMENT" and "normalize" in bad_parameter[1]
    class_count = client(
        triton.infer, server.address, "tiny-embed", texts_tensor(TEXTS), outputs=["embedding"], class_count=2
    )
    assert class_count[0] == "INVALID_ARGUMENT" and "classification" in class_count[1]

    kserve, _ = stub
    tensor = pb.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[2])
    cut_short = pb.ModelInferRequest(model_name="tiny-embed", inputs=[tensor])
    cut_short.raw_input_contents.append(raw_bytes([b"a dog", b"a cat"])[:-2])
    code, details = _code(kserve.ModelInfer, cut_short)
    assert code == "INVALID_ARGUMENT" and "raw_input_contents[0]" in details
    not_utf8 = pb.ModelInferRequest(model_name="tiny-embed", inputs=[tensor])
    not_utf8.inputs[0].contents.bytes_contents.extend([b"a dog", b"\xff\xfe"])
    code, details = _code(kserve.ModelInfer, not_utf8)
    assert code == "INVALID_ARGUMENT" and "UTF-8" in details
    assert (
        _code(kserve.ModelMetadata, pb.ModelMetadataRequest(name="tiny-embed", version="7"))[0] == "NOT_FOUND"
    )

    too_long = texts_tensor(["the cat sat on the mat " * 20])  # 120 words, tiny max_length is 72 tokens
    refused = client(triton.infer, server.address, "tiny-embed", too_long)
    assert refused[0] == "INVALID_ARGUMENT" and "max_length 72" in refused[1]
    cut = client(triton.infer, server.address, "tiny-embed", too_long, parameters={"truncate": True})
    assert cut["outputs"]["embedding"].shape == (1, 48)

    counted = server.metric("bertserve_requests_total", rpc="ModelInfer", code="INVALID_ARGUMENT")
    assert counted - failed_before == 9
    state = client(triton.probes, server.address, ["tiny-embed"])
    assert state == {"live": True, "ready": True, "models": {"tiny-embed": True}}
    assert client(triton.infer, server.address, "tiny-embed", texts_tensor(TEXTS))["outputs"][
        "embedding"
    ].shape


def test_full_queue_then_draining_server(tiny_repo, client):
    """RESOURCE_EXHAUSTED when a call does not fit the queue; while draining: live, not ready, and
    ModelInfer refused with UNAVAILABLE."""
    draining = start(tiny_repo, models=["tiny-embed"], max_queue_inputs=2)
    try:
        assert client(triton.probes, draining.address, ["tiny-embed"])["ready"] is True
        overloaded = client(triton.infer, draining.address, "tiny-embed", texts_tensor(TEXTS))
        assert overloaded[0] == "RESOURCE_EXHAUSTED" and "max_queue_inputs 2" in overloaded[1]

        async def begin_drain():  # what InferenceServer.drain does first, before it waits and stops
            draining.server.lifecycle.accepting = False
            await draining.server.health.enter_graceful_shutdown()

        draining.run(begin_drain())
        state = client(triton.probes, draining.address, ["tiny-embed"])
        assert state == {"live": True, "ready": False, "models": {"tiny-embed": False}}
        refused = client(triton.infer, draining.address, "tiny-embed", texts_tensor(TEXTS))
        assert refused[0] == "UNAVAILABLE"
        assert draining.metric("bertserve_requests_total", rpc="ModelInfer", code="UNAVAILABLE") == 1
        assert draining.metric("bertserve_requests_total", rpc="ServerReady", code="OK") == 2
    finally:
        draining.close()


def _hostile_requests() -> dict[str, pb.ModelInferRequest]:
    """Requests whose fields, quoted whole in a status message, would overflow gRPC's metadata limit."""

    def request(**tensor) -> pb.ModelInferRequest:
        fields = {"name": "text", "datatype": "BYTES", "shape": [1], **tensor}
        built = pb.ModelInferRequest(model_name="tiny-embed")
        built.inputs.add(**fields).contents.bytes_contents.append(b"a cat")
        return built

    many_names = pb.ModelInferRequest(model_name="tiny-embed")
    for i in range(20_000):
        many_names.inputs.add(name=f"input{i}", datatype="BYTES", shape=[1])
    return {
        "4 MB input name": request(name="n" * (4 << 20)),
        "1 MB datatype": request(datatype="D" * (1 << 20)),
        "500,000-element shape": request(shape=[1] * 500_000),
        "20,000 input names": many_names,
    }


def test_hostile_requests_get_a_short_invalid_argument_that_metrics_count(server, stub):
    """Each message quotes client data shortened (errors.quote) and is capped at 1 KiB: the client gets
    INVALID_ARGUMENT (not RESOURCE_EXHAUSTED "Stream removed") and the metrics count the same code."""
    kserve, _ = stub
    before = server.metric("bertserve_requests_total", rpc="ModelInfer", code="INVALID_ARGUMENT")
    for case, request in _hostile_requests().items():
        code, details = _code(kserve.ModelInfer, request)
        assert code == "INVALID_ARGUMENT", (case, details[:200])
        assert len(details.encode()) <= 1024, case
        assert "inputs" in details, case
    after = server.metric("bertserve_requests_total", rpc="ModelInfer", code="INVALID_ARGUMENT")
    assert after - before == 4
    assert kserve.ServerLive(pb.ServerLiveRequest()).live
