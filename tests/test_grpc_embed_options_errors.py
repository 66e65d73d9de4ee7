"""Bad embedding options over bertserve.v1 Embed and EmbedStream (real gRPC on 127.0.0.1, `st_repo`): each is
INVALID_ARGUMENT naming the field as this protocol spells it (`options.<field>`, `token_ids[i][j]`) and what
the model offers; the server keeps serving. And an EmbedStream of token-level requests whose client does
not read holds at most max_message_bytes of answers (service/grpc/stream_window.py), however wide its
window of inputs."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from bertserve.client import Client
from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc
from tests.embedding_models import MAX_SEQ_LENGTH, MLM_MODEL, ST_MODEL
from tests.helpers.server import ServerThread, metric, scrape, wait_for

HIDDEN = 48
VOCAB = 777  # tests/helpers/checkpoints.py TINY
MAX_MESSAGE_BYTES = 256 * 1024
Options = pb.EmbedOptions


def ids(*rows):
    return [pb.TokenIds(ids=list(row)) for row in rows]


LONG = " ".join(f"word{i % 37} and" for i in range(100))
# (request fields, what the status message starts with, what else it says)
BAD = [
    (dict(options=Options(dimensions=100)), "options.dimensions: 100", "[8, 16]"),
    (dict(options=Options(dimensions=0)), "options.dimensions: 0", "unset"),
    (dict(options=Options(prompt_name="nope")), "options.prompt_name", "query"),
    (dict(options=Options(truncation_direction="up")), "options.truncation_direction", "left"),
    (dict(options=Options(encodings=["int4"])), "options.encodings", "ubinary"),
    (dict(options=Options(tokens=True, encodings=["int8"])), "options.encodings", "dense"),
    (dict(options=Options(sparse=True)), "options.sparse", MLM_MODEL),
    (
        dict(model=MLM_MODEL, options=Options(sparse=True, sparse_threshold=-1)),
        "options.sparse_threshold",
        "at least 0",
    ),
    (
        dict(model=MLM_MODEL, options=Options(sparse=True, sparse_threshold=float("nan"))),
        "options.sparse_threshold",
        "finite",
    ),
    (dict(options=Options(chunking=pb.Chunking(length=2))), "options.chunking.length: 2", "max_length 64"),
    (dict(options=Options(chunking=pb.Chunking(length=10, overlap=8))), "options.chunking.overlap: 8", "8"),
    (dict(options=Options(chunking=pb.Chunking(pooling="median"))), "options.chunking.pooling", "mean"),
    (dict(options=Options(chunking=pb.Chunking(), tokens=True)), "options.chunking", "dense"),
    (dict(inputs=[], token_ids=ids([2, VOCAB + 5, 3])), "token_ids[0][1]", f"{VOCAB}"),
    (dict(inputs=[], token_ids=ids([2, 3], [])), "token_ids[1]", "empty"),
    (dict(token_ids=ids([2, 3])), "token_ids", "not both"),
    (
        dict(inputs=[], token_ids=ids([2, 3]), options=Options(prompt_name="query")),
        "options.prompt_name",
        "token_ids",
    ),
    (dict(inputs=[], token_ids=ids(range(2, 2 + MAX_SEQ_LENGTH + 1))), "token_ids[0]", "max_length"),
    (
        dict(inputs=[LONG] * 32, truncate=True, options=Options(tokens=True)),
        "options.tokens",
        "max_message_bytes",
    ),
]


@pytest.fixture(scope="module")
def server(st_repo):
    with ServerThread(model_repo=st_repo, max_message_bytes=MAX_MESSAGE_BYTES) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with Client(server.address, timeout=60) as running:
        yield running


@pytest.mark.parametrize(("fields", "start", "says"), BAD, ids=[b[1] for b in BAD])
def test_a_bad_option_is_invalid_argument_naming_its_field(server, client, fields, start, says):
    fields = {"inputs": ["a cat"], "model": ST_MODEL, **fields}
    with pytest.raises(grpc.RpcError) as caught:
        client.stub.Embed(pb.EmbedRequest(**fields), timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details()
    assert details.startswith(start) and says in details, details
    # the same request on a stream: its own StreamError, the stream goes on
    first = pb.EmbedStreamRequest(id=0, **fields)
    good = pb.EmbedStreamRequest(id=1, inputs=["a cat"], model=ST_MODEL)
    answers = {a.id: a for a in client.stub.EmbedStream(iter([first, good]), timeout=60)}
    assert answers[0].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert answers[0].error.message.startswith(start)
    assert len(answers[1].result.embeddings) == 1
    assert client.health() == "SERVING"
    assert client.embed(["still serving"], model=ST_MODEL).vectors.shape == (1, HIDDEN)


WINDOW = 1000  # inputs: far more than the answers max_message_bytes holds
REQUESTS = 400
TEXT = " ".join(["word"] * 200)  # cut to max_length: every answer MAX_SEQ_LENGTH token vectors


def test_a_stream_not_read_holds_at_most_max_message_bytes_of_answers(st_repo):
    """Each request is one input of MAX_SEQ_LENGTH token vectors; the client never reads. The server reads
    and computes requests only while their answers fit in max_message_bytes: the requests tokenized and not
    yet sent stay within it (before: every request the window of 1,000 inputs took, all 400)."""
    answer = MAX_SEQ_LENGTH * HIDDEN * 4  # the least each answer holds
    with ServerThread(
        model_repo=st_repo, max_message_bytes=MAX_MESSAGE_BYTES, max_stream_inputs_in_flight=WINDOW
    ) as server:
        # the client's receive window stays 64 KiB: little of what the server sends waits in the client
        channel = grpc.insecure_channel(server.address, options=[("grpc.http2.bdp_probe", 0)])
        stub = inference_pb2_grpc.InferenceStub(channel)
        options = pb.EmbedOptions(tokens=True)
        requests = [
            pb.EmbedStreamRequest(id=i, inputs=[TEXT], model=ST_MODEL, truncate=True, options=options)
            for i in range(REQUESTS)
        ]
        call = stub.EmbedStream(iter(requests), timeout=120)  # not read yet

        tokenized, sent = _steady_counts(server, ST_MODEL)
        held = tokenized - sent
        print(f"\n{tokenized:.0f} requests computed, {sent:.0f} sent, {held:.0f} held")
        assert held * answer <= MAX_MESSAGE_BYTES + answer
        assert tokenized < REQUESTS

        got = list(call)  # reading now: every request is answered
        assert sorted(r.id for r in got) == list(range(REQUESTS))
        shapes = {
            (r.result.embeddings[0].tokens.count, len(r.result.embeddings[0].tokens.values)) for r in got
        }
        assert shapes == {(MAX_SEQ_LENGTH, MAX_SEQ_LENGTH * HIDDEN)}
        assert np.isfinite(np.asarray(got[0].result.embeddings[0].tokens.values)).all()
        channel.close()


def _steady_counts(server, model: str) -> tuple[float, float]:
    """(requests tokenized, answers sent) once neither moved for 2 s (at most 60 s)."""

    def counts():
        samples = scrape(server.metrics_url)
        tokenized = metric(samples, "bertserve_tokenized_inputs_total", model=model)
        return tokenized, metric(samples, "bertserve_stream_requests_total", code="OK")

    wait_for(lambda: counts()[0] > 0, timeout=60)
    last, steady_since, started = counts(), time.monotonic(), time.monotonic()
    while time.monotonic() - steady_since < 2.0:
        time.sleep(0.2)
        now = counts()
        if now != last:
            last, steady_since = now, time.monotonic()
        assert time.monotonic() - started < 60
    return last


CHUNKED_REQUESTS = 600


def test_a_chunked_stream_request_takes_the_window_of_its_windows(st_repo):
    """A chunked request's one text may become max_inputs_per_request windows, tokenized before they get
    queue room: each takes that much of its stream's window, so a stream that is not read holds one (before:
    the window of 128 inputs held 128 such requests, each up to 256 windows of max_length tokens)."""
    text = " ".join(["word"] * 300)  # about six windows of max_length
    with ServerThread(model_repo=st_repo) as server:
        channel = grpc.insecure_channel(server.address, options=[("grpc.http2.bdp_probe", 0)])
        stub = inference_pb2_grpc.InferenceStub(channel)
        options = pb.EmbedOptions(chunking=pb.Chunking())
        requests = [
            pb.EmbedStreamRequest(id=i, inputs=[text], model=ST_MODEL, options=options)
            for i in range(CHUNKED_REQUESTS)
        ]
        call = stub.EmbedStream(iter(requests), timeout=120)  # not read yet
        tokenized, sent = _steady_counts(server, ST_MODEL)
        print(f"\n{tokenized:.0f} chunked requests computed, {sent:.0f} sent, {tokenized - sent:.0f} held")
        assert tokenized - sent <= 1 and tokenized < CHUNKED_REQUESTS
        answers = list(call)
        assert sorted(a.id for a in answers) == list(range(CHUNKED_REQUESTS))
        assert {a.result.embeddings[0].chunks for a in answers} == {answers[0].result.embeddings[0].chunks}
        assert answers[0].result.embeddings[0].chunks > 1
        channel.close()
