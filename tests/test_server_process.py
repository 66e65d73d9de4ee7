"""`bertserve serve` as a subprocess, as `make serve` runs it: an outside client that knows only
reflection gets MiniLM embeddings equal to transformers'; SIGTERM under load loses no accepted call and
exits 0; a bad setting or a broken repository stops the start with a clear message."""

from __future__ import annotations

import shutil
import time

import grpc
import numpy as np
import pytest
import torch
import transformers
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from bertserve.export.default_model import default_checkpoint_dir
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.server import ServerProcess, metric, scrape

SENTENCES = ["A man is playing a guitar.", "The weather is lovely today.", "bertserve answers over gRPC"]


@pytest.fixture(scope="module")
def default_server(default_repo):
    server = ServerProcess("--model-repo", str(default_repo), "--max-queue-delay-ms", "2").start()
    yield server
    server.kill()


def wait_serving(address: str, timeout: float = 60) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for response in stub.Watch(health_pb2.HealthCheckRequest(), timeout=timeout):
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                return


def reflection_embed(address: str, texts: list[str]) -> np.ndarray:
    """An outside client: it learns the API from reflection alone (no generated code)."""
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert "bertserve.v1.Inference" in database.get_services()
        pool = descriptor_pool.DescriptorPool(database)
        method = pool.FindServiceByName("bertserve.v1.Inference").methods_by_name["Embed"]
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        call = channel.unary_unary(
            "/bertserve.v1.Inference/Embed",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_class.FromString,
        )
        response = call(request_class(inputs=texts), timeout=30)
    return np.array([list(e.values) for e in response.embeddings])


def test_outside_client_gets_minilm_embeddings_equal_to_transformers(default_server):
    wait_serving(default_server.address)
    got = reflection_embed(default_server.address, SENTENCES)
    checkpoint = default_checkpoint_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    model = transformers.AutoModel.from_pretrained(checkpoint).eval()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # (B, T, H)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    expected = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)  # all-MiniLM-L6-v2 normalizes
    cosine = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert got.shape == (3, 384)
    assert cosine.min() >= 0.9999
    assert np.abs(got - expected).max() <= 1e-4
    samples = scrape(default_server.metrics_url)
    assert metric(samples, "bertserve_requests_total", rpc="Embed", code="OK") >= 1


def test_sigterm_under_load_loses_no_accepted_call(default_repo):
    server = ServerProcess("--model-repo", str(default_repo), "--grace-period-s", "60").start()
    try:
        wait_serving(server.address)
        channel = grpc.insecure_channel(server.address)
        stub_call = channel.unary_unary(
            "/bertserve.v1.Inference/Embed",
            request_serializer=pb.EmbedRequest.SerializeToString,
            response_deserializer=pb.EmbedResponse.FromString,
        )
        text = "a sentence long enough to keep the model busy for a little while " * 4
        calls = [
            stub_call.future(pb.EmbedRequest(inputs=[f"{k} {text}"] * 4), timeout=120) for k in range(48)
        ]
        deadline = time.monotonic() + 30
        while metric(scrape(server.metrics_url), "bertserve_inputs_total") < 192:  # every call accepted
            assert time.monotonic() < deadline, "the calls were not all accepted"
            time.sleep(0.02)
        assert not all(c.done() for c in calls), "the load finished before the signal; make it heavier"
        server.process.send_signal(15)  # SIGTERM
        wait_not_serving = grpc.insecure_channel(server.address)
        health = health_pb2_grpc.HealthStub(wait_not_serving)
        for response in health.Watch(health_pb2.HealthCheckRequest(), timeout=10):
            if response.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
        with pytest.raises(grpc.RpcError) as refused:
            stub_call(pb.EmbedRequest(inputs=["too late"]), timeout=10)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        results = [c.result() for c in calls]
        assert all(len(r.embeddings) == 4 for r in results)
        assert server.process.wait(60) == 0
        assert "every accepted call answered" in server.output
        channel.close()
        wait_not_serving.close()
    finally:
        server.kill()


def test_bad_setting_is_named_and_refused(default_repo):
    server = ServerProcess("--model-repo", str(default_repo), env={"BERTSERVE_MAX_BATCH_SIZE": "0"})
    assert server.run_to_exit() == 2
    assert "max_batch_size" in server.output and "BERTSERVE_MAX_BATCH_SIZE" in server.output


def test_tampered_repository_refuses_to_start(default_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(default_repo, repo)
    (tokenizer,) = repo.glob("*/1/tokenizer.json")
    tokenizer.write_text(tokenizer.read_text().replace("[UNK]", "[UNKNOWN]", 1))
    server = ServerProcess("--model-repo", str(repo))
    assert server.run_to_exit() == 1
    assert "sha256" in server.output and "tokenizer.json" in server.output
    assert "serving bertserve.v1.Inference" not in server.output
