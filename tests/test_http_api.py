"""The HTTP front against the gRPC API on the same server: the real `openai` client, LangChain's
OpenAIEmbeddings, tritonclient.http, and the bertserve JSON routes give what gRPC gives (<= 1e-6)."""

from __future__ import annotations

import base64
import concurrent.futures

import grpc
import httpx
import numpy as np
import pytest

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc
from tests.helpers.server import ServerThread, metric, scrape

SENTENCES = ["the cat sat on the mat", "paris is the capital of a dog", "a"]
TOLERANCE = 1e-6


class GrpcCalls:
    """bertserve.v1 over gRPC with the generated stub: the reference the HTTP answers are compared to."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.stub = inference_pb2_grpc.InferenceStub(self.channel)

    def embed(self, inputs, **fields):
        return self.stub.Embed(pb.EmbedRequest(inputs=inputs, **fields), timeout=30)

    def fill_mask(self, inputs, **fields):
        return self.stub.FillMask(pb.FillMaskRequest(inputs=inputs, **fields), timeout=30)

    def classify(self, inputs, **fields):
        return self.stub.Classify(pb.ClassifyRequest(inputs=inputs, **fields), timeout=30)

    def tokenize(self, inputs, **fields):
        return self.stub.Tokenize(pb.TokenizeRequest(inputs=inputs, **fields), timeout=30)

    def attention(self, text, **fields):
        return self.stub.Attention(pb.AttentionRequest(input=text, **fields), timeout=30)

    def info(self):
        return self.stub.Info(pb.InfoRequest(), timeout=30)


@pytest.fixture(scope="module")
def grpc_client(tiny_server):
    calls = GrpcCalls(tiny_server.address)
    yield calls
    calls.channel.close()


@pytest.fixture(scope="module")
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.http_url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def openai_client(tiny_server):
    import openai

    with openai.OpenAI(base_url=f"{tiny_server.http_url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def grpc_vectors(client: GrpcCalls, texts: list[str], model: str = "tiny-embed") -> np.ndarray:
    return np.array([e.values for e in client.embed(texts, model=model).embeddings], dtype=np.float32)


@pytest.mark.parametrize("encoding", ["float", "base64", None])
def test_openai_client_embeddings_equal_grpc(openai_client, grpc_client, encoding):
    """None: the client asks for base64 itself and decodes it (its default path)."""
    options = {} if encoding is None else {"encoding_format": encoding}
    reply = openai_client.embeddings.create(model="tiny-embed", input=SENTENCES, **options)
    if encoding == "base64":
        got = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in reply.data])
    else:
        got = np.array([d.embedding for d in reply.data], dtype=np.float32)
    expected = grpc_client.embed(SENTENCES, model="tiny-embed")
    vectors = np.array([e.values for e in expected.embeddings], dtype=np.float32)
    assert got.shape == vectors.shape == (3, 48)
    assert np.abs(got - vectors).max() <= TOLERANCE
    assert [d.index for d in reply.data] == [0, 1, 2] and reply.model == "tiny-embed"
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == expected.metadata.total_tokens > 3


def test_openai_single_string_and_model_list(openai_client, grpc_client):
    reply = openai_client.embeddings.create(model="tiny-embed", input="a dog")
    assert len(reply.data) == 1
    assert (
        np.abs(np.array(reply.data[0].embedding) - grpc_vectors(grpc_client, ["a dog"])[0]).max() <= TOLERANCE
    )
    names = [m.name for m in grpc_client.info().models]
    assert [m.id for m in openai_client.models.list()] == names
    assert openai_client.models.retrieve("tiny-mlm").id == "tiny-mlm"


def test_openai_errors_reach_the_client(openai_client):
    import openai

    with pytest.raises(openai.NotFoundError) as missing:
        openai_client.embeddings.create(model="no-such-model", input="a")
    assert "no-such-model" in missing.value.message and missing.value.body["code"] == "NOT_FOUND"
    with pytest.raises(openai.BadRequestError) as tokens:
        openai_client.embeddings.create(model="tiny-embed", input=[[1, 2, 3], [2, 100000]])
    assert "outside the vocabulary" in tokens.value.message and tokens.value.body["param"] == "input[1][1]"
    with pytest.raises(openai.BadRequestError) as dims:
        openai_client.embeddings.create(model="tiny-embed", input="a", dimensions=16)
    assert (
        "not one of the model's dimensions" in dims.value.message and dims.value.body["param"] == "dimensions"
    )
    same = openai_client.embeddings.create(
        model="tiny-embed", input="a", dimensions=48, encoding_format="float"
    )
    assert len(same.data[0].embedding) == 48


def test_langchain_openai_embeddings_equal_grpc(tiny_server, grpc_client):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model="tiny-embed",
        base_url=f"{tiny_server.http_url}/v1",
        api_key="unused",
        check_embedding_ctx_length=False,  # no tiktoken: the server tokenizes
        max_retries=0,
    )
    documents = np.array(embeddings.embed_documents(SENTENCES))
    query = np.array(embeddings.embed_query("a dog"))
    assert np.abs(documents - grpc_vectors(grpc_client, SENTENCES)).max() <= TOLERANCE
    assert np.abs(query - grpc_vectors(grpc_client, ["a dog"])[0]).max() <= TOLERANCE


def post(http: httpx.Client, path: str, body: dict) -> dict:
    reply = http.post(path, json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_bertserve_embed_and_tokenize_equal_grpc(http, grpc_client):
    body = post(http, "/bertserve/v1/embed", {"inputs": SENTENCES, "model": "tiny-embed", "normalize": False})
    expected = grpc_client.embed(SENTENCES, model="tiny-embed", normalize=False)
    got = np.array([e["values"] for e in body["embeddings"]])
    assert np.abs(got - np.array([e.values for e in expected.embeddings])).max() <= TOLERANCE
    assert body["dimension"] == expected.dimension == 48
    assert body["metadata"]["input_tokens"] == list(expected.metadata.input_tokens)
    tokens = post(http, "/bertserve/v1/tokenize", {"inputs": SENTENCES})
    grpc_tokens = grpc_client.tokenize(SENTENCES)
    for result, expected_result in zip(tokens["results"], grpc_tokens.results, strict=True):
        assert [(t["text"], t["id"], t["start"], t["end"], t["special"]) for t in result["tokens"]] == [
            (t.text, t.id, t.start, t.end, t.special) for t in expected_result.tokens
        ]


def test_bertserve_fill_mask_classify_attention_equal_grpc(http, grpc_client):
    texts = ["the cat sat on the [MASK]", "[MASK] is a dog"]
    body = post(http, "/bertserve/v1/fill-mask", {"inputs": texts, "model": "tiny-mlm", "top_k": 3})
    expected = grpc_client.fill_mask(texts, model="tiny-mlm", top_k=3)
    for result, expected_result in zip(body["results"], expected.results, strict=True):
        (mask,) = result["masks"]
        (expected_mask,) = expected_result.masks
        assert mask["position"] == expected_mask.position
        assert [c["token"] for c in mask["candidates"]] == [c.token for c in expected_mask.candidates]
        assert [c["sequence"] for c in mask["candidates"]] == [c.sequence for c in expected_mask.candidates]
        scores = [c["score"] for c in mask["candidates"]]
        assert np.allclose(scores, [c.score for c in expected_mask.candidates], atol=TOLERANCE)
    body = post(http, "/bertserve/v1/classify", {"inputs": SENTENCES, "model": "tiny-classifier", "top_k": 2})
    expected = grpc_client.classify(SENTENCES, model="tiny-classifier", top_k=2)
    for result, expected_result in zip(body["results"], expected.results, strict=True):
        assert [s["label"] for s in result["labels"]] == [s.label for s in expected_result.labels]
        assert np.allclose([s["score"] for s in result["labels"]], [s.score for s in expected_result.labels])
    body = post(
        http,
        "/bertserve/v1/attention",
        {"input": "a dog", "model": "tiny-embed", "layers": [1], "heads": [0, 2]},
    )
    expected = grpc_client.attention("a dog", model="tiny-embed", layers=[1], heads=[0, 2])
    assert [(m["layer"], m["head"]) for m in body["maps"]] == [(m.layer, m.head) for m in expected.maps]
    for got, want in zip(body["maps"], expected.maps, strict=True):
        assert np.abs(np.array(got["probabilities"]) - np.array(want.probabilities)).max() <= TOLERANCE
    info = http.get("/bertserve/v1/info").json()
    grpc_info = grpc_client.info()
    assert [m["name"] for m in info["models"]] == [m.name for m in grpc_info.models]
    assert info["limits"]["max_inputs_per_request"] == grpc_info.limits.max_inputs_per_request


def test_tritonclient_http_infers(tiny_server, grpc_client):
    import tritonclient.http as triton

    client = triton.InferenceServerClient(tiny_server.http_url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("tiny-embed")
    assert client.get_server_metadata()["name"] == "bertserve"
    index = client.get_model_repository_index()
    assert [(m["name"], m["state"]) for m in index] == [(m.name, "READY") for m in grpc_client.info().models]
    metadata = client.get_model_metadata("tiny-classifier")
    assert {o["name"] for o in metadata["outputs"]} >= {"labels", "label_scores"}
    expected = grpc_vectors(grpc_client, SENTENCES)
    for binary in (True, False):
        text = triton.InferInput("text", [len(SENTENCES)], "BYTES")
        text.set_data_from_numpy(np.array([s.encode() for s in SENTENCES], dtype=object), binary_data=binary)
        output = triton.InferRequestedOutput("embedding", binary_data=binary)
        result = client.infer("tiny-embed", [text], outputs=[output])
        assert np.abs(result.as_numpy("embedding") - expected).max() <= TOLERANCE
    result = client.infer("tiny-classifier", [text], parameters={"top_k": 2})  # all default outputs, binary
    labels = grpc_client.classify(SENTENCES, model="tiny-classifier", top_k=2)
    assert result.as_numpy("labels").tolist() == [
        [s.label.encode() for s in r.labels] for r in labels.results
    ]
    with pytest.raises(triton.InferenceServerException, match="has no output"):
        client.infer("tiny-embed", [text], outputs=[triton.InferRequestedOutput("labels")])
    client.close()


def test_openapi_document_lists_every_route(tiny_server, http):
    document = http.get("/openapi.json").json()
    routes = tiny_server.server.http.routes
    assert {(r.template, r.method.lower()) for r in routes} == {
        (path, method) for path, operations in document["paths"].items() for method in operations
    }
    assert document["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]["required"] == ["input"]


def test_http_and_grpc_calls_share_a_batch(tiny_repo):
    """With a long queue delay, one HTTP and one gRPC call sent together are computed in one batch."""
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], max_queue_delay_ms=2000) as server:
        before = scrape(server.metrics_url)
        client = GrpcCalls(server.address)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            over_grpc = pool.submit(client.embed, ["a dog"], model="tiny-embed")
            over_http = pool.submit(
                httpx.post, f"{server.http_url}/v1/embeddings", json={"input": "a cat"}, timeout=30
            )
            assert over_grpc.result().metadata.batches == 1 and over_http.result().status_code == 200
        after = scrape(server.metrics_url)
    batches = metric(after, "bertserve_batch_size_count") - metric(before, "bertserve_batch_size_count")
    inputs = metric(after, "bertserve_batch_size_sum") - metric(before, "bertserve_batch_size_sum")
    assert (batches, inputs) == (1, 2)
    code = {"rpc": "http:/v1/embeddings", "code": "OK"}
    assert (
        metric(after, "bertserve_requests_total", **code) - metric(before, "bertserve_requests_total", **code)
        == 1
    )
