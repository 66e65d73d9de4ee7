"""One encoder pass for every task: models on one encoder share one queue owner and its batches.

`shared_repo` (tests/conftest.py) holds `tiny-encoder` and two head-only models on it. Embed, FillMask and
Classify calls queued together are answered from ONE batch (one encoder run, counted once by the metrics)
and their results equal the single-task answers. An older repository whose models hold byte-identical
encoder copies shares one encoder too (deduplicated by sha256).
"""

from __future__ import annotations

import json
import shutil
import threading
import time

import grpc
import numpy as np
import pytest

from bertserve.service.engine.batcher import PREFETCH_BATCHES
from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc as pb_grpc
from tests.helpers.server import ServerThread, metric, scrape

ENCODER = "tiny-encoder"
MLM = "tiny-shared-mlm"
CLASSIFIER = "tiny-shared-classifier"


def wait_for(condition, timeout: float = 30) -> None:
    """Until the server shows the state the next step needs (the calls travel asynchronously)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the server never reached the expected state"
        time.sleep(0.01)


def requests() -> dict[str, tuple[str, object]]:
    return {
        "embed": ("Embed", pb.EmbedRequest(inputs=["a cat sat on the mat", "the dog"], model=ENCODER)),
        "mlm_embed": ("Embed", pb.EmbedRequest(inputs=["a bird"], model=MLM)),
        "fill_mask": ("FillMask", pb.FillMaskRequest(inputs=["the [MASK] sat on the mat"], model=MLM)),
        "classify": ("Classify", pb.ClassifyRequest(inputs=["a cat sat", "a dog"], model=CLASSIFIER)),
    }


def assert_same(name: str, got, expected) -> None:
    if name.endswith("embed"):
        a = np.array([e.values for e in got.embeddings])
        b = np.array([e.values for e in expected.embeddings])
        assert np.abs(a - b).max() <= 1e-5
    elif name == "fill_mask":
        for x, y in zip(got.results[0].masks, expected.results[0].masks, strict=True):
            assert [c.token_id for c in x.candidates] == [c.token_id for c in y.candidates]
            assert [c.sequence for c in x.candidates] == [c.sequence for c in y.candidates]
            assert np.allclose([c.score for c in x.candidates], [c.score for c in y.candidates], atol=1e-5)
    else:
        for x, y in zip(got.results, expected.results, strict=True):
            assert [s.index for s in x.labels] == [s.index for s in y.labels]
            assert np.allclose([s.score for s in x.labels], [s.score for s in y.labels], atol=1e-5)


def test_tasks_on_one_encoder_share_one_batch(shared_repo):
    settings = dict(model_repo=shared_repo, max_queue_delay_ms=0, max_padding_ratio=1000)
    with ServerThread(**settings) as server:
        assert [g.name for g in server.server.core.encoders] == [ENCODER]
        batcher = server.server.core.encoders[0].batcher
        real_compute, computing, release = batcher.runs.compute, threading.Event(), threading.Event()

        def gated(batch):
            computing.set()
            assert release.wait(30)
            return real_compute(batch)

        channel = grpc.insecure_channel(server.address)
        stub = pb_grpc.InferenceStub(channel)
        info = {m.name: m for m in stub.Info(pb.InfoRequest()).models}
        assert {name: m.encoder for name, m in info.items()} == {
            ENCODER: ENCODER,
            MLM: ENCODER,
            CLASSIFIER: ENCODER,
        }
        alone = {name: getattr(stub, rpc)(request, timeout=30) for name, (rpc, request) in requests().items()}

        batcher.runs.compute = gated
        before = scrape(server.metrics_url)
        blocker = stub.Embed.future(pb.EmbedRequest(inputs=["hold"], model=ENCODER), timeout=30)
        assert computing.wait(30)
        # a second blocker takes the place of the batch cut ahead (PREFETCH_BATCHES), so what follows queues
        ahead = stub.Embed.future(pb.EmbedRequest(inputs=["ahead"], model=ENCODER), timeout=30)
        wait_for(lambda: len(batcher._running) == 1 + PREFETCH_BATCHES)
        calls = {
            name: getattr(stub, rpc).future(request, timeout=30)
            for name, (rpc, request) in requests().items()
        }
        queued = sum(len(request.inputs) for _, request in requests().values())  # 6 inputs, 3 models, 3 tasks
        wait_for(lambda: metric(scrape(server.metrics_url), "bertserve_queue_depth", model=ENCODER) == queued)
        release.set()
        blocker.result(), ahead.result()
        together = {name: call.result() for name, call in calls.items()}
        after = scrape(server.metrics_url)
        channel.close()

    def moved(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    # the blockers' batches, then ONE batch holding every queued input of every model and task
    assert moved("bertserve_inference_duration_seconds_count", model=ENCODER, graph="encoder") == 3
    assert moved("bertserve_batch_size_sum", model=ENCODER) == 2 + queued
    for name in (MLM, CLASSIFIER):
        assert metric(after, "bertserve_batch_size_count", model=name) == 0  # no queue of their own
    for name, response in together.items():
        assert response.metadata.batches == 1
        assert_same(name, response, alone[name])


def test_byte_identical_encoder_copies_are_loaded_once(tiny_repo, tmp_path):
    """An older repository (every model holds its encoder): tiny-mlm given a byte-identical copy of
    tiny-embed's encoder graph (file and manifest entry) shares tiny-embed's encoder."""
    repo = tmp_path / "repo"
    for name in ("tiny-embed", "tiny-mlm"):
        shutil.copytree(tiny_repo / name, repo / name)
    embed_manifest = json.loads((repo / "tiny-embed/1/manifest.json").read_text())
    mlm_path = repo / "tiny-mlm/1/manifest.json"
    mlm_manifest = json.loads(mlm_path.read_text())
    spec = embed_manifest["graphs"]["encoder"]
    shutil.copyfile(
        repo / "tiny-embed/1" / spec["file"], repo / "tiny-mlm/1" / mlm_manifest["graphs"]["encoder"]["file"]
    )
    mlm_manifest["graphs"]["encoder"] = {**spec, "file": mlm_manifest["graphs"]["encoder"]["file"]}
    mlm_path.write_text(json.dumps(mlm_manifest))

    with ServerThread(model_repo=repo, models=["tiny-mlm", "tiny-embed"]) as server:
        assert [g.name for g in server.server.core.encoders] == ["tiny-embed"]
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.InferenceStub(channel)
            info = {m.name: m.encoder for m in stub.Info(pb.InfoRequest()).models}
            assert info == {"tiny-mlm": "tiny-embed", "tiny-embed": "tiny-embed"}
            filled = stub.FillMask(
                pb.FillMaskRequest(inputs=["the [MASK] sat"], model="tiny-mlm"), timeout=30
            )
            assert len(filled.results[0].masks[0].candidates) == 5
            one = stub.Embed(pb.EmbedRequest(inputs=["a cat"], model="tiny-mlm"), timeout=30)
            other = stub.Embed(pb.EmbedRequest(inputs=["a cat"], model="tiny-embed"), timeout=30)
            assert one.embeddings[0].values == other.embeddings[0].values  # the same encoder answered
            assert one.metadata.model == "tiny-mlm"


def _kserve_grpc(server, outputs: list[str]) -> list[str]:
    from bertserve.kserve import open_inference_pb2 as kpb
    from bertserve.kserve import open_inference_pb2_grpc as kpb_grpc

    with grpc.insecure_channel(server.address) as channel:
        request = kpb.ModelInferRequest(model_name=CLASSIFIER)
        tensor = request.inputs.add(name="text", datatype="BYTES", shape=[2])
        tensor.contents.bytes_contents.extend([b"a cat sat", b"a dog"])
        for name in outputs:
            request.outputs.add(name=name)
        response = kpb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    return [o.name for o in response.outputs]


def _kserve_rest(server, outputs: list[str]) -> list[str]:
    import json
    import urllib.request

    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a cat sat", "a dog"]}],
        "outputs": [{"name": name} for name in outputs],
    }
    request = urllib.request.Request(
        f"{server.http_url}/v2/models/{CLASSIFIER}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return [o["name"] for o in json.loads(response.read())["outputs"]]


@pytest.mark.parametrize("front", [_kserve_grpc, _kserve_rest], ids=["grpc", "rest"])
def test_kserve_tasks_of_one_request_share_one_encoder_run(shared_repo, front):
    outputs = ["embedding", "labels", "label_scores"]
    with ServerThread(model_repo=shared_repo, max_padding_ratio=1000) as server:
        before = scrape(server.metrics_url)
        answered = front(server, outputs)
        after = scrape(server.metrics_url)
    assert answered == outputs
    runs = metric(after, "bertserve_batch_size_sum", model=ENCODER) - metric(
        before, "bertserve_batch_size_sum", model=ENCODER
    )
    batches = metric(after, "bertserve_batch_size_count", model=ENCODER) - metric(
        before, "bertserve_batch_size_count", model=ENCODER
    )
    assert runs == 4 and batches == 1  # 2 texts x (embed, classify) in one encoder run


@pytest.mark.parametrize("front", [_kserve_grpc, _kserve_rest], ids=["grpc", "rest"])
def test_kserve_tasks_of_one_request_are_admitted_all_or_none(shared_repo, front):
    """2 texts x 2 tasks = 4 inputs over a queue of 3: refused whole, no task of it computed."""
    import urllib.error

    with ServerThread(model_repo=shared_repo, max_queue_inputs=3) as server:
        before = scrape(server.metrics_url)
        with pytest.raises((grpc.RpcError, urllib.error.HTTPError)) as refused:
            front(server, ["embedding", "labels"])
        after = scrape(server.metrics_url)
    error = refused.value
    code = error.code() if isinstance(error, grpc.RpcError) else error.code
    assert code in (grpc.StatusCode.RESOURCE_EXHAUSTED, 429)
    batches = [metric(s, "bertserve_batch_size_count", model=ENCODER) for s in (before, after)]
    assert batches[1] == batches[0]
