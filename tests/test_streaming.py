"""EmbedStream (service/grpc/streaming.py) and Client.embed_stream over real gRPC on 127.0.0.1: order and
values equal to unary Embed, per-request errors with their ids, cancellation, draining, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from bertserve.client import Client
from bertserve.client_stream import DEFAULT_BATCH_SIZE, StreamRequestError
from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc
from tests.helpers.server import ServerThread, metric, scrape, wait_for
from tests.helpers.texts import random_texts

MODEL = "tiny-embed"
CODE_OF_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def corpus(n: int, seed: int = 3, max_words: int = 25) -> list[str]:
    """Texts of 1 to `max_words` words (25 words can exceed the tiny models' max_length 72: truncate)."""
    return random_texts(n, seed, max_words=max_words)


def unary(client: Client, texts: list[str], size: int = 256, **options) -> np.ndarray:
    chunks = [texts[i : i + size] for i in range(0, len(texts), size)]
    return np.concatenate([client.embed(chunk, **options).vectors for chunk in chunks])


def request(request_id: int, inputs: list[str], **fields) -> pb.EmbedStreamRequest:
    return pb.EmbedStreamRequest(id=request_id, inputs=inputs, model=MODEL, **fields)


def test_20000_inputs_come_back_in_order_equal_to_unary_embed(tiny_server):
    texts = corpus(20_000)
    before = scrape(tiny_server.metrics_url)
    with Client(tiny_server.address, timeout=300) as client:
        streamed = client.embed_stream_batches(texts, model=MODEL, truncate=True)  # 32 texts a request
        streamed = np.concatenate(list(streamed))
        expected = unary(client, texts, model=MODEL, truncate=True)
        # the per-vector iterator, on a prefix, with options passed through
        plain = np.stack(
            list(client.embed_stream(texts[:300], model=MODEL, normalize=False, batch_size=7, truncate=True))
        )
        assert (
            np.abs(plain - unary(client, texts[:300], model=MODEL, normalize=False, truncate=True)).max()
            <= 1e-6
        )
    assert streamed.shape == expected.shape == (20_000, expected.shape[1])
    assert streamed.dtype == np.float32
    assert np.abs(streamed - expected).max() <= 1e-6

    after = scrape(tiny_server.metrics_url)
    moved = {
        key: metric(after, name, **labels) - metric(before, name, **labels)
        for key, name, labels in [
            ("ok", "bertserve_requests_total", {"rpc": "EmbedStream", "code": "OK"}),
            ("answered", "bertserve_stream_requests_total", {"code": "OK"}),
            ("admissions", "bertserve_stream_inputs_in_flight_count", {}),
            ("within_window", "bertserve_stream_inputs_in_flight_bucket", {"le": "128.0"}),
        ]
    }
    assert moved["ok"] == 2
    assert moved["answered"] == 20_000 / DEFAULT_BATCH_SIZE + 300 // 7 + 1
    assert moved["admissions"] == moved["answered"]
    # max_stream_inputs_in_flight (128 by default) was never exceeded
    assert moved["within_window"] == moved["admissions"]
    assert metric(after, "bertserve_streams_open") == 0


def test_a_failed_request_comes_back_with_its_id_and_the_stream_goes_on(tiny_server):
    requests = [request(7, ["a cat"]), request(8, ["a dog", "   "]), request(9, ["a tree"], truncate=True)]
    with Client(tiny_server.address, timeout=60) as client:
        responses = {r.id: r for r in client.stub.EmbedStream(iter(requests))}
        assert sorted(responses) == [7, 8, 9]
        failed = responses[8]
        assert failed.WhichOneof("outcome") == "error"
        assert CODE_OF_VALUE[failed.error.code] == grpc.StatusCode.INVALID_ARGUMENT
        assert "inputs[1]" in failed.error.message and "empty" in failed.error.message
        for ok in (7, 9):
            assert responses[ok].WhichOneof("outcome") == "result"
            vector = np.array(responses[ok].result.embeddings[0].values, dtype=np.float32)
            expected = client.embed([requests[ok - 7].inputs[0]], model=MODEL).vectors[0]
            assert np.abs(vector - expected).max() <= 1e-6
        assert responses[9].result.metadata.model == MODEL

        # stop_on_error (on the first request): the failed request is answered, then the stream ends with its code
        stopping = [
            request(1, ["a cat"], stop_on_error=True),
            request(2, [""]),
            *(request(i, ["x"]) for i in range(3, 50)),
        ]
        call = client.stub.EmbedStream(iter(stopping))
        seen = []
        with pytest.raises(grpc.RpcError) as raised:
            seen.extend(call)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "request id 2" in raised.value.details()
        assert any(r.id == 2 and r.WhichOneof("outcome") == "error" for r in seen)

        # the typed client raises the first failed request with the index of its first input
        texts = [*corpus(100, max_words=8), "", *corpus(10, max_words=8)]
        with pytest.raises(StreamRequestError) as raised:
            list(client.embed_stream(texts, model=MODEL, batch_size=16))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert raised.value.first_input == 96 and "inputs[4]" in raised.value.details()

        # an unknown model is NOT_FOUND for that request only
        answer = next(
            iter(client.stub.EmbedStream(iter([pb.EmbedStreamRequest(id=5, inputs=["a"], model="nope")])))
        )
        assert answer.id == 5 and CODE_OF_VALUE[answer.error.code] == grpc.StatusCode.NOT_FOUND


def test_an_undecodable_request_ends_the_stream_with_invalid_argument(tiny_server):
    with grpc.insecure_channel(tiny_server.address) as channel:
        stream = channel.stream_stream("/bertserve.v1.Inference/EmbedStream")
        good = request(1, ["a cat"]).SerializeToString()
        responses = []
        with pytest.raises(grpc.RpcError) as raised:
            responses.extend(stream(iter([good, b"\xff\xff\xff"]), timeout=30))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "EmbedStreamRequest" in raised.value.details()
        # what was read before the bad request was still answered
        assert [pb.EmbedStreamResponse.FromString(r).id for r in responses] == [1]


def test_a_cancelled_stream_leaves_the_queue_empty_and_the_server_healthy(tiny_server):
    def endless():
        i = 0
        while True:  # bounded by the cancel below
            yield f"text number {i} " + "word " * (i % 40)
            i += 1

    before = scrape(tiny_server.metrics_url)
    with Client(tiny_server.address, timeout=60) as client:
        batches = client.embed_stream_batches(
            endless(), model=MODEL, batch_size=32, max_requests_in_flight=64, truncate=True
        )
        for taken, _ in enumerate(batches):
            if taken == 20:
                break
        batches.close()  # cancels the call
        # a unary call after the cancel: the queue owner has passed over whatever the stream had queued
        assert client.embed(["still serving"], model=MODEL).vectors.shape[0] == 1
        assert client.health() == "SERVING"

    def cancelled(samples) -> float:
        labels = {"rpc": "EmbedStream", "code": "CANCELLED"}
        return metric(samples, "bertserve_requests_total", **labels) - metric(
            before, "bertserve_requests_total", **labels
        )

    # the server sees the cancel asynchronously: its stream handler ends (and is counted) in its own time
    wait_for(lambda: cancelled(scrape(tiny_server.metrics_url)) >= 1)
    wait_for(lambda: metric(scrape(tiny_server.metrics_url), "bertserve_streams_open") == 0)
    wait_for(lambda: metric(scrape(tiny_server.metrics_url), "bertserve_queue_depth", model=MODEL) == 0)
    assert cancelled(scrape(tiny_server.metrics_url)) == 1


def test_draining_answers_what_was_read_then_ends_the_stream_unavailable(tiny_repo):
    release = threading.Event()

    def three_then_wait():
        for i in range(3):
            yield request(i, [f"a cat {i}"])
        release.wait(30)  # the client keeps the stream open while the server drains

    with (
        ServerThread(model_repo=tiny_repo, models=[MODEL], grace_period_s=20) as server,
        Client(server.address, timeout=60) as client,
    ):
        if True:
            call = client.stub.EmbedStream(three_then_wait())
            answered = [next(call).id for _ in range(3)]
            assert sorted(answered) == [0, 1, 2]
            drained = threading.Thread(target=lambda: server.call(server.server.drain))
            drained.start()
            with pytest.raises(grpc.RpcError) as raised:
                list(call)
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "draining" in raised.value.details()
            release.set()
            drained.join(60)
            assert not drained.is_alive()
            # a new stream is refused while draining
            with pytest.raises(grpc.RpcError):
                list(client.stub.EmbedStream(iter([request(9, ["x"])]), timeout=5))


def test_a_full_queue_slows_streams_down_and_no_input_is_tokenized_twice(tiny_repo):
    """Admission before work: a stream's request takes room in the queue before it is tokenized and waits
    for it, so with a queue far smaller than the streams' windows nothing is refused, and every input
    is tokenized exactly once (before, requests were tokenized, refused, retried and tokenized again)."""
    streams, per_stream = 3, 400
    texts = [corpus(per_stream, seed=4 + k, max_words=10) for k in range(streams)]
    # a queue of 8 inputs: each stream's 128-input window overflows it all the time
    with (
        ServerThread(model_repo=tiny_repo, models=[MODEL], max_queue_inputs=8) as server,
        Client(server.address, timeout=120) as client,
    ):
        before = scrape(server.metrics_url)
        with ThreadPoolExecutor(streams) as pool:
            runs = [
                pool.submit(
                    lambda t: np.concatenate(list(client.embed_stream_batches(t, model=MODEL, batch_size=8))),
                    t,
                )
                for t in texts
            ]
            streamed = [run.result(300) for run in runs]
        samples = scrape(server.metrics_url)
        expected = [unary(client, t, size=8, model=MODEL) for t in texts]

    def moved(name: str, **labels) -> float:
        return metric(samples, name, **labels) - metric(before, name, **labels)

    for got, want in zip(streamed, expected, strict=True):
        assert np.abs(got - want).max() <= 1e-6
    assert moved("bertserve_stream_requests_total", code="RESOURCE_EXHAUSTED") == 0
    assert moved("bertserve_tokenized_inputs_total", model=MODEL) == streams * per_stream
    assert moved("bertserve_requests_total", rpc="EmbedStream", code="OK") == streams


def test_a_stream_past_its_deadline_ends_deadline_exceeded(tiny_server):
    """The server's deadline (x-request-timeout, 1 s) is strictly before the client's (60 s): the server
    ends the stream itself with DEADLINE_EXCEEDED and counts it before the status is sent, so nothing
    races however loaded the machine is (with the client's own deadline, its cancel and the server's
    clock raced)."""
    never = threading.Event()

    def one_then_wait():
        yield request(1, ["a cat"])
        never.wait(60)  # the client keeps the stream open past the server's deadline

    labels = {"rpc": "EmbedStream", "code": "DEADLINE_EXCEEDED"}
    before = scrape(tiny_server.metrics_url)
    with Client(tiny_server.address) as client:
        call = client.stub.EmbedStream(one_then_wait(), timeout=60, metadata=[("x-request-timeout", "1")])
        answers = []
        with pytest.raises(grpc.RpcError) as raised:
            answers.extend(call)
        never.set()
    assert [a.id for a in answers] == [1]
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "deadline" in raised.value.details()
    after = scrape(tiny_server.metrics_url)
    assert (
        metric(after, "bertserve_requests_total", **labels)
        == metric(before, "bertserve_requests_total", **labels) + 1
    )
    wait_for(lambda: metric(scrape(tiny_server.metrics_url), "bertserve_streams_open") == 0)


def test_a_bad_request_timeout_is_invalid_argument(tiny_server):
    with Client(tiny_server.address, timeout=30) as client:
        call = client.stub.EmbedStream(
            iter([request(1, ["a cat"])]), metadata=[("x-request-timeout", "soon")]
        )
        with pytest.raises(grpc.RpcError) as raised:
            list(call)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-request-timeout" in raised.value.details()


def test_a_slow_reader_that_keeps_writing_gets_every_answer_and_unavailable_at_a_drain(tiny_repo):
    """gRPC's asyncio client turns a stream the server ends under its writes into INTERNAL "Internal
    error from Core" and drops the answers not yet read. At a drain the server goes on reading: requests
    sent after it began are answered UNAVAILABLE, and the stream ends once the client stops writing."""
    code_unavailable = grpc.StatusCode.UNAVAILABLE.value[0]

    async def slow_reader(server: ServerThread) -> tuple[list, grpc.StatusCode, str, bool]:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stop_writing = asyncio.Event()

            async def requests():
                for i in range(3_000):  # bounded: the client stops at its first UNAVAILABLE answer
                    if stop_writing.is_set():
                        return
                    yield request(i, ["a text that is read slowly"] * 8)

            call = inference_pb2_grpc.InferenceStub(channel).EmbedStream(requests(), timeout=120)
            answers = [await call.read()]
            drained = asyncio.get_running_loop().run_in_executor(None, server.call, server.server.drain)
            with contextlib.suppress(grpc.aio.AioRpcError):  # the stream's status, read below
                while (answer := await call.read()) is not grpc.aio.EOF:
                    answers.append(answer)
                    if answer.WhichOneof("outcome") == "error" and answer.error.code == code_unavailable:
                        stop_writing.set()
                    await asyncio.sleep(0.01)  # a slow reader
            return answers, await call.code(), await call.details(), await drained

    server = ServerThread(model_repo=tiny_repo, models=[MODEL], grace_period_s=60).start()
    try:
        answers, code, details, finished = asyncio.run(slow_reader(server))
    finally:
        server.stop()
    assert code == grpc.StatusCode.UNAVAILABLE, (code, details)
    assert "draining" in details
    assert finished, "the drain ran out of its grace period"
    served = [a.id for a in answers if a.WhichOneof("outcome") == "result"]
    refused = [a.id for a in answers if a.WhichOneof("outcome") == "error"]
    assert served and refused
    # every request the server read got exactly one answer: those before the drain a result, the rest
    # UNAVAILABLE
    assert sorted(served + refused) == list(range(len(answers)))
    assert max(served) < min(refused)
    assert {a.error.code for a in answers if a.WhichOneof("outcome") == "error"} == {code_unavailable}
