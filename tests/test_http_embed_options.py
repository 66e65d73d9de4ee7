"""The embedding options over HTTP, route by route, against references computed here (tests/embed_reference.py):
bertserve.v1 /embed (every EmbedOptions field, token_ids), TEI /embed, /embed_all, /embed_sparse, OpenAI
/v1/embeddings through the `openai` client (dimensions, base64, token ids) and Cohere /v2/embed through the
`cohere` SDK's ClientV2.embed. Floats within 1e-5; quantized encodings and sparse ids exact."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from tests.embed_reference import Reference
from tests.embedding_models import MLM_MODEL, ST_MODEL
from tests.helpers.server import ServerThread

TOLERANCE = 1e-5
TEXTS = ["the cat sat on the mat", "paris is the capital of france", "a"]
LONG = "the cat sat on the mat and the dog sat in paris " * 12  # over tiny-st's max_length
ST = {"model": ST_MODEL}  # TEI routes answer with the default embedding model without it
QUANTIZED = ("float16", "int8", "uint8", "binary", "ubinary")


@pytest.fixture(scope="module")
def server(st_repo):
    with ServerThread(model_repo=st_repo, max_queue_delay_ms=5) as server:
        yield server


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.http_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def ref(st_model_dir, make_tiny_checkpoint, st_repo) -> Reference:
    return Reference(st_model_dir, make_tiny_checkpoint("BertForMaskedLM"), st_repo)


def ok(response: httpx.Response) -> dict | list:
    assert response.status_code == 200, response.text[:500]
    return response.json()


def close(got, expected) -> None:
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= TOLERANCE


def embed(http: httpx.Client, **body) -> dict:
    return ok(http.post("/bertserve/v1/embed", json={"model": ST_MODEL, **body}))


def test_dimensions_prompts_and_encodings(http, ref):
    body = embed(http, inputs=TEXTS, dimensions=16, prompt_name="document", encodings=["float", *QUANTIZED])
    assert body["dimension"] == 16
    values = np.array([e["values"] for e in body["embeddings"]], dtype=np.float32)
    close(values, ref.dense(TEXTS, "document", 16))
    for precision in QUANTIZED:  # exactly sentence-transformers' quantize_embeddings of the same vectors
        expected = ref.quantized(values, precision)  # each JSON value reads back as it in its own dtype
        got = np.array([e[precision] for e in body["embeddings"]], dtype=expected.dtype)
        assert got.shape == expected.shape and np.array_equal(got, expected), precision
    default = embed(http, inputs=TEXTS)  # no prompt named: the model's default prompt ("query")
    close([e["values"] for e in default["embeddings"]], ref.dense(TEXTS))
    assert default["dimension"] == 48
    raw = embed(http, inputs=TEXTS, dimensions=8, normalize=False, encodings=["int8"])
    int8 = np.array([e["int8"] for e in raw["embeddings"]])
    expected = [ref.pooled(ref.ids(ref.prompt(None) + t), normalize=False, dim=8) for t in TEXTS]
    assert all("values" not in e for e in raw["embeddings"])
    rounded = ref.quantized(np.array(expected, dtype=np.float32), "int8", normalized=False)
    assert np.abs(int8.astype(int) - rounded.astype(int)).max() <= 1  # float noise may cross one step


def test_token_ids_and_left_truncation(http, ref):
    ids = [ref.ids(t) for t in TEXTS]  # special tokens included, no prompt: used as given
    body = embed(http, token_ids=ids)
    close([e["values"] for e in body["embeddings"]], [ref.pooled(i) for i in ids])
    assert body["metadata"]["input_tokens"] == [len(i) for i in ids]
    left = embed(http, inputs=[LONG, TEXTS[0]], truncate=True, truncation_direction="left")
    prompt = ref.prompt(None)
    expected = [ref.pooled(ref.ids(prompt + t, side="left")) for t in (LONG, TEXTS[0])]
    close([e["values"] for e in left["embeddings"]], expected)
    right = embed(http, inputs=[LONG], truncate=True)
    close(right["embeddings"][0]["values"], ref.pooled(ref.ids(prompt + LONG)))
    tei = ok(
        http.post("/embed", json={**ST, "inputs": LONG, "truncate": True, "truncation_direction": "Left"})
    )
    close(tei, expected[:1])


def test_tokens_with_dense_in_one_call(http, ref):
    body = embed(http, inputs=TEXTS, tokens=True, dense=True, dimensions=8)
    prompt = ref.prompt(None)
    for entry, text in zip(body["embeddings"], TEXTS, strict=True):
        ids = ref.ids(prompt + text)
        close(entry["tokens"], ref.hidden(ids))
        close(entry["values"], ref.pooled(ids, dim=8))
    only = embed(http, token_ids=[ref.ids(TEXTS[1])], tokens=True)
    assert "values" not in only["embeddings"][0]
    close(only["embeddings"][0]["tokens"], ref.hidden(ref.ids(TEXTS[1])))


def _threshold(weights: list[np.ndarray]) -> float:
    """A threshold between the weights' middle values with no weight within 1e-4 of it, so float noise
    cannot change which ids pass it, and some ids pass while others do not."""
    values = np.unique(np.concatenate(weights))
    gaps = np.flatnonzero(np.diff(values) > 2e-4)
    assert len(gaps), "no gap between the weights"
    middle = gaps[np.argmin(np.abs(gaps - len(values) // 2))]
    return float((values[middle] + values[middle + 1]) / 2)


def check_sparse(ids: list[int], values: list[float], expected: np.ndarray, threshold: float) -> None:
    wanted = np.flatnonzero(expected > threshold)
    assert ids == wanted.tolist()  # exact, ascending
    close(values, expected[wanted])


def test_sparse_on_the_mlm_model(http, ref):
    expected = [ref.sparse(t) for t in TEXTS]
    threshold = _threshold(expected)
    body = ok(
        http.post(
            "/bertserve/v1/embed",
            json={"model": MLM_MODEL, "inputs": TEXTS, "sparse": True, "sparse_threshold": threshold},
        )
    )
    for entry, weights in zip(body["embeddings"], expected, strict=True):
        check_sparse(entry["sparse"]["indices"], entry["sparse"]["values"], weights, threshold)
        assert "values" not in entry
    tei = ok(http.post("/embed_sparse", json={"inputs": TEXTS, "sparse_threshold": threshold}))  # tiny-mlm
    for entries, weights in zip(tei, expected, strict=True):
        check_sparse([e["index"] for e in entries], [e["value"] for e in entries], weights, threshold)


def test_tei_embed_and_embed_all(http, ref):
    close(ok(http.post("/embed", json={**ST, "inputs": TEXTS})), ref.dense(TEXTS))
    dims = ok(
        http.post("/embed", json={**ST, "inputs": TEXTS[0], "prompt_name": "document", "dimensions": 8})
    )
    close(dims, ref.dense(TEXTS[:1], "document", 8))
    ids = ref.ids(TEXTS[2])
    close(ok(http.post("/embed", json={**ST, "inputs": ids})), [ref.pooled(ids)])  # one input of token ids
    raw = ok(http.post("/embed", json={**ST, "inputs": [ids, ids], "normalize": False}))
    close(raw, [ref.pooled(ids, normalize=False)] * 2)
    every = ok(http.post("/embed_all", json={**ST, "inputs": TEXTS}))
    assert len(every) == len(TEXTS)
    for rows, text in zip(every, TEXTS, strict=True):
        close(rows, ref.hidden(ref.ids(ref.prompt(None) + text)))


def _windows(ids: list[int], length: int, overlap: int) -> list[list[int]]:
    size, stride = length - 2, length - 2 - overlap
    windows = []
    for start in range(0, len(ids), stride):
        windows.append(ids[start : start + size])
        if start + size >= len(ids):
            break
    return windows


def test_chunking_equals_windows_one_by_one(http, ref):
    length, overlap = 16, 4
    text = LONG
    body_ids = ref.tokenizer(ref.prompt(None) + text, add_special_tokens=False)["input_ids"]
    cls, sep = ref.tokenizer.cls_token_id, ref.tokenizer.sep_token_id
    windows = [[cls, *w, sep] for w in _windows(body_ids, length, overlap)]
    rows = embed(http, token_ids=windows, normalize=False)["embeddings"]
    pooled = np.array([r["values"] for r in rows], dtype=np.float64)
    weights = np.array([len(w) for w in windows], dtype=np.float64)
    for pooling, vector in (
        ("mean", (pooled * weights[:, None]).sum(0) / weights.sum()),
        ("max", pooled.max(0)),
    ):
        chunking = {"length": length, "overlap": overlap, "pooling": pooling}
        got = embed(http, inputs=[text], chunking=chunking)["embeddings"][0]
        assert got["chunks"] == len(windows)
        close(got["values"], vector / np.linalg.norm(vector))


def test_openai_client_dimensions_base64_and_token_ids(server, ref):
    import openai

    client = openai.OpenAI(api_key="x", base_url=f"{server.http_url}/v1")
    reply = client.embeddings.create(model=ST_MODEL, input=TEXTS, dimensions=8)  # base64 on the wire
    close([d.embedding for d in reply.data], ref.dense(TEXTS, dim=8))
    floats = client.embeddings.create(model=ST_MODEL, input=TEXTS, encoding_format="float")
    close([d.embedding for d in floats.data], ref.dense(TEXTS))
    ids = [ref.ids(t) for t in TEXTS]
    by_ids = client.embeddings.create(model=ST_MODEL, input=ids, dimensions=16)
    close([d.embedding for d in by_ids.data], [ref.pooled(i, dim=16) for i in ids])
    one = client.embeddings.create(model=ST_MODEL, input=ids[0])
    close(one.data[0].embedding, ref.pooled(ids[0]))
    assert by_ids.usage.prompt_tokens == sum(len(i) for i in ids)


def test_cohere_sdk_embed_v2(server, http, ref):
    import cohere

    client = cohere.ClientV2(api_key="x", base_url=server.http_url)
    types = ["float", "int8", "uint8", "binary", "ubinary"]
    reply = client.embed(
        model=ST_MODEL, texts=TEXTS, input_type="search_document", embedding_types=types, output_dimension=16
    )
    values = np.array(reply.embeddings.float_, dtype=np.float32)
    close(values, ref.dense(TEXTS, "document", 16))
    for precision in types[1:]:
        got = np.array(getattr(reply.embeddings, precision))
        assert np.array_equal(got, ref.quantized(values, precision).astype(got.dtype)), precision
    assert reply.texts == TEXTS and reply.meta.billed_units.input_tokens > len(TEXTS)
    assert reply.response_type == "embeddings_by_type" and reply.id
    query = client.embed(model=ST_MODEL, texts=TEXTS, input_type="search_query")
    close(query.embeddings.float_, ref.dense(TEXTS, "query"))
    start = client.embed(model=ST_MODEL, texts=[LONG], input_type="search_query", truncate="START")
    close(start.embeddings.float_, [ref.pooled(ref.ids(ref.prompt("query") + LONG, side="left"))])
    b64 = ok(http.post("/v2/embed", json={"texts": TEXTS, "model": ST_MODEL, "embedding_types": ["base64"]}))
    decoded = [np.frombuffer(base64.b64decode(s), dtype="<f4") for s in b64["embeddings"]["base64"]]
    close(decoded, ref.dense(TEXTS))
    with pytest.raises(cohere.BadRequestError) as refused:
        client.embed(model=ST_MODEL, texts=[LONG], input_type="search_query", truncate="NONE")
    assert "texts[0]" in str(refused.value.body)


def test_openapi_describes_the_embedding_options(http):
    paths = http.get("/openapi.json").json()["paths"]

    def fields(path: str) -> dict:
        return paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]

    assert set(fields("/bertserve/v1/embed")) >= {
        "token_ids",
        "dimensions",
        "encodings",
        "chunking",
        "sparse",
    }
    assert set(fields("/embed")) >= {"inputs", "truncation_direction", "prompt_name", "dimensions"}
    assert {"/embed_all", "/embed_sparse"} <= set(paths)
    assert fields("/v2/embed")["truncate"]["enum"] == ["NONE", "START", "END"]
    assert len(fields("/v1/embeddings")["input"]["oneOf"]) == 4  # str, [str], [id], [[id]]
