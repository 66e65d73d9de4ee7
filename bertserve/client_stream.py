"""The client side of EmbedStream (bulk embedding): `Client.embed_stream` and `Client.embed_stream_batches`.

The texts are cut into requests of `batch_size` and streamed; the server answers each request as it
finishes, possibly out of order, and this puts the answers back in input order. At most
`max_requests_in_flight` requests are sent and not yet handed to the caller, so memory stays bounded
whatever the corpus size, and a caller that consumes slowly slows the stream down (the server's own
flow control does the rest).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Iterator

import grpc
import numpy as np

from bertserve import client_results as results
from bertserve.v1 import inference_pb2 as pb

DEFAULT_BATCH_SIZE = 32
DEFAULT_REQUESTS_IN_FLIGHT = 8


class StreamRequestError(grpc.RpcError):
    """One request of the stream failed (the stream was then ended). `first_input` is the index of the
    request's first input in the caller's sequence; the message names the input within the request."""

    def __init__(self, request_id: int, first_input: int, code: grpc.StatusCode, message: str):
        super().__init__(f"inputs from {first_input} (request {request_id}): {code.name}: {message}")
        self.request_id, self.first_input = request_id, first_input
        self._code, self._message = code, message

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message


_CODE_OF_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def _batched(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(texts)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def embed_stream_batches(
    stub,
    texts: Iterable[str],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    model: str = "",
    normalize: bool | None = None,
    truncate: bool = False,
    timeout: float | None = None,
    max_requests_in_flight: int = DEFAULT_REQUESTS_IN_FLIGHT,
) -> Iterator[np.ndarray]:
    """float32 arrays [n, dimension], one per `batch_size` texts, in input order. A failed request
    raises StreamRequestError once every batch before it was yielded (the first request asks the server
    to stop at a failure: stop_on_error); a failed stream raises grpc.RpcError; an error raised by
    `texts` itself is raised as is."""
    if batch_size < 1 or max_requests_in_flight < 1:
        raise ValueError("batch_size and max_requests_in_flight must be at least 1")
    slots = threading.Semaphore(max_requests_in_flight)
    stopping = threading.Event()
    first_input: dict[int, int] = {}  # request id -> index of its first input
    source_error: list[BaseException] = []

    def requests() -> Iterator[pb.EmbedStreamRequest]:
        start = 0
        try:
            for request_id, chunk in enumerate(_batched(texts, batch_size)):
                slots.acquire()
                if stopping.is_set():
                    return
                request = pb.EmbedStreamRequest(
                    id=request_id, inputs=chunk, model=model, truncate=truncate, stop_on_error=request_id == 0
                )
                if normalize is not None:
                    request.normalize = normalize
                first_input[request_id] = start
                start += len(chunk)
                yield request
        except Exception as exc:  # gRPC would only say "Exception iterating requests"
            source_error.append(exc)
            raise

    call = stub.EmbedStream(requests(), timeout=timeout)
    ready: dict[int, np.ndarray] = {}
    next_id = 0
    failed: StreamRequestError | None = None  # the earliest failed request; those before it still come
    try:
        for response in call:
            if response.WhichOneof("outcome") == "error":
                if failed is None or response.id < failed.request_id:
                    code = _CODE_OF_VALUE.get(response.error.code, grpc.StatusCode.UNKNOWN)
                    start = first_input.get(response.id, -1)
                    failed = StreamRequestError(response.id, start, code, response.error.message)
                continue
            ready[response.id] = results.embeddings(response.result).vectors
            while next_id in ready and (failed is None or next_id < failed.request_id):
                yield ready.pop(next_id)
                next_id += 1
                slots.release()
    except grpc.RpcError:
        if source_error:
            raise source_error[0] from None
        if failed is None:
            raise
    finally:
        stopping.set()
        slots.release()  # wakes the request thread if it waits for a slot
        call.cancel()
    if source_error:
        raise source_error[0]
    if failed is not None:
        raise failed


def embed_stream(stub, texts: Iterable[str], **options) -> Iterator[np.ndarray]:
    """One float32 vector [dimension] per text, in input order (see `embed_stream_batches`)."""
    for batch in embed_stream_batches(stub, texts, **options):
        yield from batch
