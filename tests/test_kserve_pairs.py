"""Sentence pairs over KServe v2: a classify model's second BYTES input "text_pair", over REST with
tritonclient.http (JSON and binary tensor data) and over gRPC (typed and raw contents), against
transformers' logits of the exported tiny pair classifier (tests/pair_models.py), within 1e-4."""

from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest

from bertserve.kserve import open_inference_pb2 as pb
from bertserve.kserve import open_inference_pb2_grpc as pb_grpc
from bertserve.service.kserve.tensors import decode_bytes_elements, encode_bytes_elements
from tests.helpers.server import ServerThread

TOLERANCE = 1e-4
CLASSIFIER, EMBED = "tiny-pair-classifier", "tiny-embed"
FIRSTS = ["a dog", "the cat sat", "paris"]
SECONDS = ["cat and dog", "on the mat", "is the capital of a dog"]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def server(pair_repo):
    with ServerThread(model_repo=pair_repo, max_queue_delay_ms=5) as server:
        yield server


@pytest.fixture(scope="module")
def expected(tiny_pair_classifier) -> np.ndarray:
    return softmax(tiny_pair_classifier.expected_logits(FIRSTS, SECONDS))


def by_label(labels: np.ndarray, scores: np.ndarray, names: list[str]) -> np.ndarray:
    """(n, labels) scores in label-index order from best-first label names and scores."""
    index = {name.encode(): i for i, name in enumerate(names)}
    out = np.zeros(scores.shape, dtype=np.float32)
    for row, (row_labels, row_scores) in enumerate(zip(labels, scores, strict=True)):
        for label, score in zip(row_labels, row_scores, strict=True):
            out[row, index[label]] = score
    return out


def label_names(tiny_pair_classifier) -> list[str]:
    id2label = tiny_pair_classifier.manifest.tasks.classify.id2label
    return [id2label[i] for i in range(len(id2label))]


def test_tritonclient_http_classifies_pairs(server, expected, tiny_pair_classifier):
    import tritonclient.http as triton

    names = label_names(tiny_pair_classifier)
    client = triton.InferenceServerClient(server.http_url.removeprefix("http://"))
    metadata = client.get_model_metadata(CLASSIFIER)
    assert [i["name"] for i in metadata["inputs"]] == ["text", "text_pair"]
    assert [i["name"] for i in client.get_model_metadata(EMBED)["inputs"]] == ["text"]
    for binary in (True, False):
        tensors = []
        for name, texts in (("text_pair", SECONDS), ("text", FIRSTS)):  # any order
            tensor = triton.InferInput(name, [len(texts)], "BYTES")
            tensor.set_data_from_numpy(
                np.array([t.encode() for t in texts], dtype=object), binary_data=binary
            )
            tensors.append(tensor)
        result = client.infer(CLASSIFIER, tensors)  # default outputs: classify's only
        assert {o["name"] for o in result.get_response()["outputs"]} == {"labels", "label_scores"}
        got = by_label(result.as_numpy("labels"), result.as_numpy("label_scores"), names)
        assert np.abs(got - expected).max() <= TOLERANCE
    with pytest.raises(triton.InferenceServerException, match="only classify takes sentence pairs"):
        client.infer(CLASSIFIER, tensors, outputs=[triton.InferRequestedOutput("embedding")])
    with pytest.raises(triton.InferenceServerException, match="has no classify task"):
        client.infer(EMBED, tensors)
    client.close()


def test_rest_text_pair_bad_input(server):
    def body(pair: dict) -> dict:
        text = {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}
        return {"inputs": [text, {"name": "text_pair", "datatype": "BYTES", **pair}]}

    cases = [
        (
            {"shape": [3], "data": ["a", "b", "c"]},
            "inputs['text_pair'].shape",
            "must match the 2 elements of 'text'",
        ),
        ({"shape": [2], "data": ["a", 1]}, "inputs['text_pair'].data[1]", "must be a string"),
        ({"shape": [2], "data": ["a"]}, "inputs['text_pair']", "needs 2 elements"),
    ]
    with httpx.Client(base_url=server.http_url, timeout=60) as client:
        for pair, field, part in cases:
            response = client.post(f"/v2/models/{CLASSIFIER}/infer", json=body(pair))
            assert response.status_code == 400, response.text
            assert response.json()["error"].startswith(field) and part in response.json()["error"]
        three = body({"shape": [2], "data": ["a", "b"]})
        three["inputs"].append({"name": "other", "datatype": "BYTES", "shape": [1], "data": ["c"]})
        refused = client.post(f"/v2/models/{CLASSIFIER}/infer", json=three)
        assert refused.status_code == 400 and "text_pair" in refused.json()["error"]
        strategy = body({"shape": [2], "data": ["a", "b"]}) | {"parameters": {"truncation_strategy": 3}}
        refused = client.post(f"/v2/models/{CLASSIFIER}/infer", json=strategy)
        assert refused.status_code == 400 and "truncation_strategy" in refused.json()["error"]
        single = {"inputs": body({})["inputs"][:1], "parameters": {"truncation_strategy": "bogus"}}
        refused = client.post(f"/v2/models/{CLASSIFIER}/infer", json=single)  # no text_pair: still checked
        assert refused.status_code == 400 and "truncation_strategy: 'bogus'" in refused.json()["error"]
        good = client.post(f"/v2/models/{CLASSIFIER}/infer", json=body({"shape": [2], "data": ["c", "d"]}))
        assert good.status_code == 200


def test_grpc_text_pair_typed_and_raw(server, expected, tiny_pair_classifier):
    names = label_names(tiny_pair_classifier)
    tensor = pb.ModelInferRequest.InferInputTensor
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        typed = pb.ModelInferRequest(
            model_name=CLASSIFIER,
            inputs=[
                tensor(
                    name="text",
                    datatype="BYTES",
                    shape=[3],
                    contents={"bytes_contents": [t.encode() for t in FIRSTS]},
                ),
                tensor(
                    name="text_pair",
                    datatype="BYTES",
                    shape=[3, 1],
                    contents={"bytes_contents": [t.encode() for t in SECONDS]},
                ),
            ],
        )
        answer = {o.name: o for o in stub.ModelInfer(typed, timeout=60).outputs}
        labels = np.array(answer["labels"].contents.bytes_contents, dtype=object).reshape(3, 3)
        scores = np.array(answer["label_scores"].contents.fp32_contents, dtype=np.float32).reshape(3, 3)
        assert np.abs(by_label(labels, scores, names) - expected).max() <= TOLERANCE

        raw = pb.ModelInferRequest(
            model_name=CLASSIFIER,
            inputs=[
                tensor(name="text_pair", datatype="BYTES", shape=[3]),
                tensor(name="text", datatype="BYTES", shape=[3]),
            ],
            raw_input_contents=[
                encode_bytes_elements([t.encode() for t in SECONDS]),
                encode_bytes_elements([t.encode() for t in FIRSTS]),
            ],
        )
        reply = stub.ModelInfer(raw, timeout=60)
        position = {o.name: i for i, o in enumerate(reply.outputs)}
        scores = np.frombuffer(reply.raw_output_contents[position["label_scores"]], dtype="<f4").reshape(3, 3)
        labels_raw = reply.raw_output_contents[position["labels"]]
        labels = np.array(decode_bytes_elements(labels_raw, "labels"), dtype=object).reshape(3, 3)
        assert np.abs(by_label(labels, scores, names) - expected).max() <= TOLERANCE

        metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name=CLASSIFIER), timeout=60)
        assert [i.name for i in metadata.inputs] == ["text", "text_pair"]
        # both texts long: only_first cuts the first alone, longest_first would cut both
        long, second = "the cat sat on the mat and the dog sat in paris " * 6, "a dog sat on the mat " * 6
        cut = pb.ModelInferRequest(
            model_name=CLASSIFIER,
            inputs=[
                tensor(
                    name="text", datatype="BYTES", shape=[1], contents={"bytes_contents": [long.encode()]}
                ),
                tensor(
                    name="text_pair",
                    datatype="BYTES",
                    shape=[1],
                    contents={"bytes_contents": [second.encode()]},
                ),
            ],
            outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="label_scores")],
        )
        cut.parameters["truncate"].bool_param = True
        cut.parameters["raw_scores"].bool_param = True
        cut.parameters["top_k"].int64_param = 1
        cut.parameters["truncation_strategy"].string_param = "only_first"
        (best,) = stub.ModelInfer(cut, timeout=60).outputs[0].contents.fp32_contents
        logits = tiny_pair_classifier.expected_logits([long], [second], truncation="only_first")[0]
        other = tiny_pair_classifier.expected_logits([long], [second], truncation="longest_first")[0]
        assert abs(best - logits.max()) <= TOLERANCE < abs(best - other.max())

        del raw.raw_input_contents[1]
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(raw, timeout=60)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "raw_input_contents: 1 entries for 2 input tensors" in caught.value.details()
