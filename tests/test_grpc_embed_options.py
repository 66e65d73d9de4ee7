"""The embedding options through bertserve.v1 Embed and EmbedStream over real gRPC on 127.0.0.1, on the tiny
sentence-transformers model and the fill-mask model of tests/embedding_models.py (`st_repo`), with the
Python client: each option against a reference computed here (sentence-transformers' encode, its
quantize_embeddings with the manifest's calibration ranges, transformers' tokenizer cut on the left, the
MLM head of transformers' BertForMaskedLM for SPLADE weights, windows embedded one by one for chunking):
floats within 1e-5, quantized values and sparse ids exact. Then every bad option: INVALID_ARGUMENT naming
`options.<field>` (or `token_ids`), and the server still serving."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import torch

from bertserve.client import Chunking, Client
from bertserve.v1 import inference_pb2 as pb
from tests.embedding_models import (
    DEFAULT_PROMPT_NAME,
    MATRYOSHKA_DIMENSIONS,
    MAX_SEQ_LENGTH,
    MLM_MODEL,
    PROMPTS,
    ST_MODEL,
    version_dir,
)
from tests.helpers.server import ServerThread

TEXTS = ["the cat sat on the mat", "a dog", "paris is the capital of a dog, or so they say"]
LONG = " ".join(f"word{i % 37} and, then" for i in range(120))  # over max_length 64
HIDDEN = 48
TOLERANCE = 1e-5
ENCODINGS = ("float", "float16", "int8", "uint8", "binary", "ubinary")


@pytest.fixture(scope="module")
def server(st_repo):
    with ServerThread(model_repo=st_repo, max_input_chars=4000) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with Client(server.address, timeout=60) as running:
        yield running


@pytest.fixture(scope="module")
def st(st_model_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(st_model_dir), device="cpu")


@pytest.fixture(scope="module")
def manifest(st_repo) -> dict:
    return json.loads((version_dir(st_repo) / "manifest.json").read_text())


def close(got: np.ndarray, expected) -> None:
    expected = np.asarray(expected, dtype=np.float32)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert np.abs(got - expected).max() <= TOLERANCE


def st_vectors(st, ids: list[list[int]]) -> np.ndarray:
    """sentence-transformers' pooled, normalized vectors of token ids given as they are."""
    rows = []
    for row in ids:
        features = {
            "input_ids": torch.tensor([row]),
            "attention_mask": torch.ones(1, len(row), dtype=torch.long),
            "token_type_ids": torch.zeros(1, len(row), dtype=torch.long),
        }
        with torch.no_grad():
            rows.append(st(features)["sentence_embedding"][0].numpy())
    return np.stack(rows)


def test_info_shows_what_each_model_offers(client, manifest):
    models = {m.name: m for m in client.info().models}
    tiny = models[ST_MODEL]
    assert tiny.dimensions == MATRYOSHKA_DIMENSIONS
    assert tiny.prompts == PROMPTS and tiny.default_prompt_name == DEFAULT_PROMPT_NAME
    assert tiny.encodings == list(ENCODINGS)  # the export computed calibration ranges
    assert not tiny.sparse and models[MLM_MODEL].sparse


@pytest.mark.parametrize("dimensions", [*MATRYOSHKA_DIMENSIONS, HIDDEN])
def test_dimensions_equal_sentence_transformers_truncate_dim(client, st, dimensions):
    got = client.embed(TEXTS, model=ST_MODEL, dimensions=dimensions)
    assert got.dimension == dimensions
    close(got.vectors, st.encode(TEXTS, truncate_dim=dimensions, normalize_embeddings=True))


@pytest.mark.parametrize("prompt_name", sorted(PROMPTS))
def test_prompt_name_equals_sentence_transformers(client, st, prompt_name):
    got = client.embed(TEXTS, model=ST_MODEL, prompt_name=prompt_name)
    close(got.vectors, st.encode(TEXTS, prompt_name=prompt_name, normalize_embeddings=True))


def test_left_truncation_keeps_the_last_tokens(client, st, st_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(st_model_dir), truncation_side="left")
    text = PROMPTS[DEFAULT_PROMPT_NAME] + LONG
    ids = tokenizer([text], truncation=True, max_length=MAX_SEQ_LENGTH)["input_ids"]
    got = client.embed([LONG], model=ST_MODEL, truncate=True, truncation_direction="left")
    assert got.metadata.input_tokens == [MAX_SEQ_LENGTH] and got.metadata.truncated == [True]
    close(got.vectors, st_vectors(st, ids))
    right = client.embed([LONG], model=ST_MODEL, truncate=True)
    assert np.abs(right.vectors - got.vectors).max() > 1e-3  # the other end was kept


def test_token_ids_are_used_as_given(client, st):
    ids = st.tokenizer(TEXTS)["input_ids"]
    got = client.embed(model=ST_MODEL, token_ids=ids)
    assert got.metadata.input_tokens == [len(row) for row in ids]
    close(got.vectors, st.encode(TEXTS, prompt="", normalize_embeddings=True))


@pytest.mark.parametrize("dimensions", [MATRYOSHKA_DIMENSIONS[-1], HIDDEN])
def test_encodings_equal_quantize_embeddings(client, st, manifest, dimensions):
    from sentence_transformers.util.quantization import quantize_embeddings

    got = client.embed(TEXTS, model=ST_MODEL, dimensions=dimensions, encodings=ENCODINGS)
    close(got.vectors, st.encode(TEXTS, truncate_dim=dimensions, normalize_embeddings=True))
    ranges = np.array(manifest["tasks"]["embed"]["calibration_ranges"][f"{dimensions}:normalized"])
    assert set(got.encodings) == set(ENCODINGS) - {"float"}
    for precision in ("int8", "uint8", "binary", "ubinary"):
        expected = quantize_embeddings(got.vectors, precision, ranges=ranges)
        assert got.encodings[precision].dtype == expected.dtype, precision
        np.testing.assert_array_equal(got.encodings[precision], expected, err_msg=precision)
    np.testing.assert_array_equal(got.encodings["float16"], got.vectors.astype(np.float16))


def test_an_encoding_alone_leaves_the_floats_out(client, manifest):
    got = client.embed(TEXTS, model=ST_MODEL, encodings=["ubinary"])
    assert got.vectors is None and got.dimension == HIDDEN
    assert got.encodings["ubinary"].shape == (len(TEXTS), HIDDEN // 8)
    reply = client.stub.Embed(
        pb.EmbedRequest(inputs=TEXTS, model=ST_MODEL, options=pb.EmbedOptions(encodings=["int8"]))
    )
    assert [len(e.values) for e in reply.embeddings] == [0] * len(TEXTS)
    assert [len(e.int8) for e in reply.embeddings] == [HIDDEN] * len(TEXTS)


def test_token_embeddings_equal_sentence_transformers(client, st):
    got = client.embed(TEXTS, model=ST_MODEL, tokens=True, dense=True)
    expected = st.encode(TEXTS, output_value="token_embeddings", convert_to_numpy=False)
    assert len(got.tokens) == len(TEXTS)
    for mine, theirs in zip(got.tokens, expected, strict=True):
        close(mine, theirs.numpy())
    close(got.vectors, st.encode(TEXTS, normalize_embeddings=True))  # the same pass's pooled vector
    alone = client.embed(TEXTS, model=ST_MODEL, tokens=True)
    assert alone.vectors is None and alone.dimension == 0
    for a, b in zip(alone.tokens, got.tokens, strict=True):
        close(a, b)


def _splade(checkpoint, texts: list[str]) -> np.ndarray:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    model = AutoModelForMaskedLM.from_pretrained(str(checkpoint)).eval()
    rows = []
    for text in texts:
        with torch.no_grad():
            logits = model(**tokenizer([text], return_tensors="pt")).logits[0]  # (tokens, vocab)
        rows.append(torch.log1p(torch.relu(logits)).max(dim=0).values.numpy())
    return np.stack(rows)


def _threshold_away_from(weights: np.ndarray) -> float:
    """A threshold no weight is within 1e-3 of (ids compared exactly must not sit on a tie)."""
    for candidate in np.linspace(0.05, 1.0, 96):
        if np.abs(weights - candidate).min() > 1e-3:
            return float(candidate)
    raise AssertionError("no threshold away from the weights")


def test_sparse_weights_equal_splade_over_transformers(client, make_tiny_checkpoint):
    expected = _splade(make_tiny_checkpoint("BertForMaskedLM"), TEXTS)
    threshold = _threshold_away_from(expected)
    got = client.embed(TEXTS, model=MLM_MODEL, sparse=True, sparse_threshold=threshold)
    assert got.vectors is None and len(got.sparse) == len(TEXTS)
    for sparse, weights in zip(got.sparse, expected, strict=True):
        ids = np.flatnonzero(weights > threshold)
        assert len(ids) > 0
        np.testing.assert_array_equal(sparse.indices, ids)
        close(sparse.values, weights[ids])


def test_dense_tokens_and_sparse_in_one_call(client, make_tiny_checkpoint):
    both = client.embed(
        TEXTS, model=MLM_MODEL, dense=True, tokens=True, sparse=True, encodings=["float", "binary"]
    )
    alone = client.embed(TEXTS, model=MLM_MODEL)
    close(both.vectors, alone.vectors)
    assert both.encodings["binary"].shape == (len(TEXTS), HIDDEN // 8)
    assert [t.shape for t in both.tokens] == [(n, HIDDEN) for n in alone.metadata.input_tokens]
    expected = _splade(make_tiny_checkpoint("BertForMaskedLM"), TEXTS)
    for sparse, weights in zip(both.sparse, expected, strict=True):
        np.testing.assert_array_equal(sparse.indices, np.flatnonzero(weights > 0))


def _windows(ids: list[int], length: int, overlap: int) -> list[list[int]]:
    width, start, out = length - 2, 0, []
    while True:
        out.append(ids[start : start + width])
        if start + width >= len(ids):
            return out
        start += width - overlap


@pytest.mark.parametrize(("pooling", "dimensions"), [("mean", None), ("max", MATRYOSHKA_DIMENSIONS[0])])
def test_chunking_equals_the_windows_embedded_one_by_one(client, st, pooling, dimensions):
    length, overlap = 20, 5
    texts = [LONG, "a short one"]
    got = client.embed(
        texts, model=ST_MODEL, chunking=Chunking(length, overlap, pooling), dimensions=dimensions
    )
    tokenizer = st.tokenizer
    expected = []
    for text in texts:
        ids = tokenizer(PROMPTS[DEFAULT_PROMPT_NAME] + text, add_special_tokens=False)["input_ids"]
        windows = [
            [tokenizer.cls_token_id, *w, tokenizer.sep_token_id] for w in _windows(ids, length, overlap)
        ]
        raw = client.embed(model=ST_MODEL, token_ids=windows, normalize=False).vectors.astype(np.float64)
        sizes = np.array([len(w) for w in windows], dtype=np.float64)
        pooled = raw.max(axis=0) if pooling == "max" else (raw * sizes[:, None]).sum(axis=0) / sizes.sum()
        pooled = pooled[: dimensions or HIDDEN]
        expected.append(pooled / np.linalg.norm(pooled))
        assert got.chunks[len(expected) - 1] == len(windows)
    assert got.chunks[0] > 1 and got.chunks[1] == 1
    close(got.vectors, np.stack(expected))


def test_embed_stream_takes_the_options(client, st):
    stub = client.stub
    ids = st.tokenizer("a cat")["input_ids"]
    options = pb.EmbedOptions(
        dimensions=MATRYOSHKA_DIMENSIONS[1], prompt_name="document", encodings=["float", "int8"]
    )
    requests = [
        pb.EmbedStreamRequest(id=0, inputs=TEXTS, model=ST_MODEL, options=options),
        pb.EmbedStreamRequest(id=1, inputs=TEXTS, model=ST_MODEL, options=pb.EmbedOptions(dimensions=100)),
        pb.EmbedStreamRequest(
            id=2,
            model=ST_MODEL,
            options=pb.EmbedOptions(tokens=True),
            token_ids=[pb.TokenIds(ids=ids)],
        ),
    ]
    answers = {r.id: r for r in stub.EmbedStream(iter(requests), timeout=60)}
    first = answers[0].result
    vectors = np.array([e.values for e in first.embeddings], dtype=np.float32)
    close(
        vectors,
        st.encode(
            TEXTS, prompt_name="document", truncate_dim=MATRYOSHKA_DIMENSIONS[1], normalize_embeddings=True
        ),
    )
    assert [len(e.int8) for e in first.embeddings] == [MATRYOSHKA_DIMENSIONS[1]] * len(TEXTS)
    assert answers[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert answers[1].error.message.startswith("options.dimensions: 100")
    (tokens,) = answers[2].result.embeddings
    assert tokens.tokens.count == len(ids) and len(tokens.tokens.values) == len(ids) * HIDDEN
    assert not tokens.values


def test_the_embed_command_takes_the_options(server, client, capsys):
    from bertserve.cli import main

    argv = ["embed", "--address", server.address, "--model", ST_MODEL, "--dimensions", "16"]
    argv += ["--prompt-name", "document", "--encoding", "float", "--encoding", "int8", "--json", *TEXTS]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = client.embed(
        TEXTS, model=ST_MODEL, dimensions=16, prompt_name="document", encodings=["float", "int8"]
    )
    close(np.array(printed["vectors"], dtype=np.float32), expected.vectors)
    assert printed["encodings"]["int8"] == expected.encodings["int8"].tolist()
    argv = [
        "embed",
        "--address",
        server.address,
        "--model",
        ST_MODEL,
        "--truncate",
        "--truncation-direction",
        "left",
    ]
    assert main([*argv, "--tokens", LONG]) == 0
    assert f"tokens: {MAX_SEQ_LENGTH} x {HIDDEN}" in capsys.readouterr().out
    assert main(["info", "--address", server.address]) == 0
    assert "dimensions 8, 16; prompts document, query (default query)" in capsys.readouterr().out
    assert main([*argv, "--dimensions", "100", "a cat"]) == 1
    assert "INVALID_ARGUMENT: options.dimensions: 100" in capsys.readouterr().err


def test_embed_stream_of_the_client_takes_dimensions_and_prompts(client, st):
    texts = TEXTS * 5
    got = np.stack(
        list(client.embed_stream(texts, model=ST_MODEL, batch_size=4, dimensions=8, prompt_name="document"))
    )
    close(got, st.encode(texts, prompt_name="document", truncate_dim=8, normalize_embeddings=True))
