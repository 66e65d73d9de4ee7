"""The embedding options on KServe v2 (service/kserve/embed_tensors.py), with Triton's own clients against a real
server on 127.0.0.1 serving `st_repo`: the quantized encodings, token-level and sparse outputs as tensors and
the parameters dimensions / prompt_name / truncation_direction / sparse_threshold, against sentence-transformers,
quantize_embeddings and SPLADE over transformers' MLM head (1e-5, quantized and ids exact), over gRPC
(tritonclient.grpc, in a child process: tests/helpers/triton_client.py) and REST (tritonclient.http, JSON
and binary). Bad parameters and oversized padded outputs are INVALID_ARGUMENT / 400 naming the field."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from bertserve.client import Client
from tests.embedding_models import (
    DEFAULT_PROMPT_NAME,
    MAX_SEQ_LENGTH,
    MLM_MODEL,
    PROMPTS,
    ST_MODEL,
    version_dir,
)
from tests.helpers import triton_client as triton
from tests.helpers.server import ServerThread
from tests.test_grpc_embed_options import _splade, _threshold_away_from, close

TEXTS = ["the cat sat on the mat", "a dog", "paris is the capital of a dog, or so they say"]
LONG = " ".join(f"word{i % 37} and, then" for i in range(120))
HIDDEN = 48
DIMENSIONS = 16
ENCODED = ["embedding_float16", "embedding_int8", "embedding_uint8", "embedding_binary", "embedding_ubinary"]
TOKENS = ["token_embeddings", "token_lengths"]
SPARSE = ["sparse_indices", "sparse_values", "sparse_lengths"]
MAX_MESSAGE_BYTES = 256 * 1024


@pytest.fixture(scope="module")
def server(st_repo):
    with ServerThread(model_repo=st_repo, max_message_bytes=MAX_MESSAGE_BYTES) as running:
        yield running


@pytest.fixture(scope="module")
def child():
    with triton.child() as pool:
        yield pool


@pytest.fixture(scope="module")
def st(st_model_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(st_model_dir), device="cpu")


@pytest.fixture(scope="module")
def ranges(st_repo) -> np.ndarray:
    manifest = json.loads((version_dir(st_repo) / "manifest.json").read_text())
    return np.array(manifest["tasks"]["embed"]["calibration_ranges"][f"{DIMENSIONS}:normalized"])


def infer(child, server, model, outputs, parameters, texts=TEXTS):
    values = np.array([t.encode() for t in texts], dtype=object)
    return child.submit(
        triton.infer, server.address, model, values, outputs=outputs, parameters=parameters
    ).result(120)


def check_dense(outputs: dict, st, ranges) -> None:
    from sentence_transformers.util.quantization import quantize_embeddings

    vectors = outputs["embedding"]
    close(
        vectors, st.encode(TEXTS, prompt_name="document", truncate_dim=DIMENSIONS, normalize_embeddings=True)
    )
    np.testing.assert_array_equal(outputs["embedding_float16"], vectors.astype(np.float16))
    for precision in ("int8", "uint8", "binary", "ubinary"):
        expected = quantize_embeddings(vectors, precision, ranges=ranges)
        got = outputs[f"embedding_{precision}"]
        assert got.dtype == expected.dtype, precision
        np.testing.assert_array_equal(got, expected, err_msg=precision)


def check_tokens(outputs: dict, st) -> None:
    expected = st.encode(
        TEXTS, prompt_name="document", output_value="token_embeddings", convert_to_numpy=False
    )
    lengths = outputs["token_lengths"]
    assert lengths.tolist() == [len(e) for e in expected]
    padded = outputs["token_embeddings"]
    assert padded.shape == (len(TEXTS), max(lengths), HIDDEN)
    for row, (n, theirs) in enumerate(zip(lengths, expected, strict=True)):
        close(padded[row, :n], theirs.numpy())
        assert not padded[row, n:].any()


def test_grpc_outputs_equal_the_references(server, child, st, ranges):
    parameters = {"dimensions": DIMENSIONS, "prompt_name": "document"}
    answer = infer(child, server, ST_MODEL, ["embedding", *ENCODED, *TOKENS], parameters)
    outputs = answer["outputs"]
    assert list(outputs) == ["embedding", *ENCODED, *TOKENS]
    check_dense(outputs, st, ranges)
    check_tokens(outputs, st)
    # no outputs named: the vector only, as before
    plain = infer(child, server, ST_MODEL, None, {"prompt_name": "document"})
    assert list(plain["outputs"]) == ["embedding"]
    close(plain["outputs"]["embedding"], st.encode(TEXTS, prompt_name="document", normalize_embeddings=True))


def test_grpc_sparse_equals_splade(server, child, make_tiny_checkpoint):
    expected = _splade(make_tiny_checkpoint("BertForMaskedLM"), TEXTS)
    threshold = _threshold_away_from(expected)
    outputs = infer(child, server, MLM_MODEL, SPARSE, {"sparse_threshold": threshold})["outputs"]
    for row, weights in enumerate(expected):
        ids = np.flatnonzero(weights > threshold)
        n = outputs["sparse_lengths"][row]
        assert n == len(ids) > 0
        np.testing.assert_array_equal(outputs["sparse_indices"][row, :n], ids)
        close(outputs["sparse_values"][row, :n], weights[ids])
        assert (outputs["sparse_indices"][row, n:] == -1).all() and not outputs["sparse_values"][
            row, n:
        ].any()


def test_grpc_left_truncation_equals_bertserve_v1(server, child):
    outputs = infer(
        child, server, ST_MODEL, ["embedding"], {"truncate": True, "truncation_direction": "left"}, [LONG]
    )
    with Client(server.address, timeout=60) as client:
        left = client.embed([LONG], model=ST_MODEL, truncate=True, truncation_direction="left")
        right = client.embed([LONG], model=ST_MODEL, truncate=True)
    close(outputs["outputs"]["embedding"], left.vectors)
    assert np.abs(left.vectors - right.vectors).max() > 1e-3
    assert left.metadata.input_tokens == [MAX_SEQ_LENGTH]


BAD = [
    (ST_MODEL, ["embedding"], {"dimensions": 100}, "parameters['dimensions']: 100"),
    (ST_MODEL, ["embedding"], {"dimensions": 0}, "parameters['dimensions']: 0"),
    (ST_MODEL, ["embedding"], {"prompt_name": "nope"}, "parameters['prompt_name']"),
    (ST_MODEL, ["embedding"], {"truncation_direction": "up"}, "parameters['truncation_direction']"),
    (ST_MODEL, ["embedding"], {"dimensions": "16"}, "parameters['dimensions']: must be a int64_param"),
    (MLM_MODEL, SPARSE, {"sparse_threshold": -1.0}, "parameters['sparse_threshold']"),
    (ST_MODEL, SPARSE, {}, "outputs[0].name: model tiny-st has no output 'sparse_indices'"),
    # 32 inputs, one of max_length: padded to [32, 64, 48] float32, 393,216 bytes
    (ST_MODEL, TOKENS, {"truncate": True}, "outputs['token_embeddings']: padded to [32, 64, 48]"),
]


@pytest.mark.parametrize(("model", "outputs", "parameters", "start"), BAD, ids=[b[3][:40] for b in BAD])
def test_grpc_bad_parameters_name_the_field(server, child, model, outputs, parameters, start):
    texts = [LONG] + ["a"] * 31 if "truncate" in parameters else TEXTS
    code, message = infer(child, server, model, outputs, parameters, texts)
    assert code == "INVALID_ARGUMENT" and message.startswith(start), message
    assert "embedding" in infer(child, server, ST_MODEL, ["embedding"], {})["outputs"]


def test_rest_outputs_json_and_binary(server, st, ranges):
    import tritonclient.http as triton_http

    client = triton_http.InferenceServerClient(server.http_url.removeprefix("http://"))
    try:
        for binary in (True, False):
            text = triton_http.InferInput("text", [len(TEXTS)], "BYTES")
            text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object), binary_data=binary)
            names = ["embedding", *ENCODED, *TOKENS]
            requested = [triton_http.InferRequestedOutput(name, binary_data=binary) for name in names]
            parameters = {"dimensions": DIMENSIONS, "prompt_name": "document"}
            result = client.infer(ST_MODEL, [text], outputs=requested, parameters=parameters)
            outputs = {name: result.as_numpy(name) for name in names}
            check_dense(outputs, st, ranges)
            check_tokens(outputs, st)
        with pytest.raises(triton_http.InferenceServerException, match=r"parameters\['dimensions'\]: 100"):
            client.infer(ST_MODEL, [text], parameters={"dimensions": 100})
        metadata = client.get_model_metadata(ST_MODEL)
        assert [o["name"] for o in metadata["outputs"]] == ["embedding", *ENCODED, *TOKENS]
        assert metadata["outputs"][0]["shape"] == [-1, -1]  # Matryoshka: the request decides
    finally:
        client.close()


def test_default_prompt_applies_on_kserve(server, child, st):
    outputs = infer(child, server, ST_MODEL, ["embedding"], {})["outputs"]
    assert DEFAULT_PROMPT_NAME in PROMPTS
    close(outputs["embedding"], st.encode(TEXTS, normalize_embeddings=True))


def test_rest_json_token_embeddings_over_max_message_bytes_are_refused_unbuilt(server):
    """8 inputs of 64 tokens x 48 floats: about 98 KB in binary (under the limit), about 490 KB as JSON:
    refused naming the output before the JSON is built; the same outputs as binary data are answered."""
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [8], "data": [LONG] * 8}],
        "outputs": [{"name": "token_embeddings"}],
        "parameters": {"truncate": True},
    }
    url = f"{server.http_url}/v2/models/{ST_MODEL}/infer"
    response = httpx.post(url, json=body, timeout=60)
    assert response.status_code == 400, response.text[:300]
    message = response.json()["error"]
    assert message.startswith("outputs['token_embeddings']: about") and "max_message_bytes" in message
    body["outputs"] = [{"name": "token_embeddings", "parameters": {"binary_data": True}}]
    assert httpx.post(url, json=body, timeout=60).status_code == 200
