"""The client side of EmbedStream (bulk embedding): `Client.embed_stream` and `Client.embed_stream_batches`.

The texts are cut into requests of `batch_size` and streamed; the server answers each request as it
finishes, possibly out of order, and this puts the answers back in input order. At most
`max_requests_in_flight` requests are sent and not yet handed to the caller, so memory stays bounded
whatever the corpus size, and a caller that consumes slowly slows the stream down (the server's own
flow control does the rest). A request the server refused because its queue was full is sent again
after a backoff; the stream half-closes only once every request is answered.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterable, Iterator

import grpc
import numpy as np

from bertserve import client_results as results
from bertserve.v1 import inference_pb2 as pb

DEFAULT_BATCH_SIZE = 32  # a quarter of the server's default max_stream_inputs_in_flight (128)
DEFAULT_REQUESTS_IN_FLIGHT = 8
RETRYABLE = {grpc.StatusCode.RESOURCE_EXHAUSTED}  # the server's queue was full: worth sending again
MAX_RETRIES = 30  # per request
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.02, 2.0  # doubling between retries of one request


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
    dimensions: int | None = None,
    prompt_name: str = "",
    truncation_direction: str = "",
) -> Iterator[np.ndarray]:
    """float32 arrays [n, dimension], one per `batch_size` texts, in input order. `dimensions`,
    `prompt_name`, `truncation_direction`: as `Client.embed`'s.

    A request refused because the server's queue was full (RESOURCE_EXHAUSTED) is sent again after a
    backoff (up to MAX_RETRIES times). Any other failed request raises StreamRequestError once every
    batch before it was yielded; a failed stream raises grpc.RpcError; an error raised by `texts`
    itself is raised as is."""
    if batch_size < 1 or max_requests_in_flight < 1:
        raise ValueError("batch_size and max_requests_in_flight must be at least 1")
    flow = _Flow(max_requests_in_flight)
    source_error: list[BaseException] = []
    options = pb.EmbedOptions(prompt_name=prompt_name, truncation_direction=truncation_direction)
    if dimensions is not None:
        options.dimensions = dimensions

    def requests() -> Iterator[pb.EmbedStreamRequest]:
        chunks = enumerate(_batched(texts, batch_size))
        start = 0
        try:
            while (request := flow.next_to_send()) is not None:
                if request is _NEW:
                    item = next(chunks, None)
                    if item is None:
                        flow.source_exhausted()
                        continue
                    request_id, chunk = item
                    request = pb.EmbedStreamRequest(
                        id=request_id, inputs=chunk, model=model, truncate=truncate, options=options
                    )
                    if normalize is not None:
                        request.normalize = normalize
                    flow.sending(request, start)
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
                code = _CODE_OF_VALUE.get(response.error.code, grpc.StatusCode.UNKNOWN)
                if flow.retry(response.id, code):
                    continue
                if failed is None or response.id < failed.request_id:
                    start = flow.first_input.get(response.id, -1)
                    failed = StreamRequestError(response.id, start, code, response.error.message)
                flow.stop()
            else:
                flow.answered(response.id)
                ready[response.id] = results.embeddings(response.result).vectors
            while next_id in ready and (failed is None or next_id < failed.request_id):
                yield ready.pop(next_id)
                next_id += 1
                flow.handed_over()
            if failed is not None and next_id == failed.request_id:
                break  # every batch before the failed request was yielded
    except grpc.RpcError:
        if source_error:
            raise source_error[0] from None
        if failed is None:
            raise
    finally:
        flow.stop()  # ends the request thread if it waits
        call.cancel()
    if source_error:
        raise source_error[0]
    if failed is not None:
        raise failed


_NEW = object()  # next_to_send: take the next chunk of the source


class _Flow:
    """What the request thread may send next: a request to retry, a new one while fewer than `limit` are
    unanswered or not yet handed to the caller, or nothing more (None) once everything is answered."""

    def __init__(self, limit: int):
        self._changed = threading.Condition()
        self._free = limit  # requests that may still be sent before the caller takes a batch
        self._retry: deque[pb.EmbedStreamRequest] = deque()
        self._unanswered: dict[int, list] = {}  # id -> [request, attempts]
        self._exhausted = self._stopped = False
        self.first_input: dict[int, int] = {}  # request id -> index of its first input

    def next_to_send(self):
        with self._changed:
            self._changed.wait_for(
                lambda: (
                    self._stopped
                    or self._retry
                    or (not self._exhausted and self._free > 0)
                    or (self._exhausted and not self._unanswered)
                )
            )
            if self._stopped:
                return None
            if self._retry:
                return self._retry.popleft()
            if self._exhausted:
                return None  # every request answered: half-close
            self._free -= 1
            return _NEW

    def sending(self, request: pb.EmbedStreamRequest, first_input: int) -> None:
        with self._changed:
            self._unanswered[request.id] = [request, 0]
            self.first_input[request.id] = first_input

    def source_exhausted(self) -> None:
        with self._changed:
            self._exhausted = True
            self._free += 1

    def retry(self, request_id: int, code: grpc.StatusCode) -> bool:
        """Schedules a refused request again when the refusal is worth retrying; False otherwise."""
        with self._changed:
            entry = self._unanswered.get(request_id)
            if code not in RETRYABLE or entry is None or entry[1] >= MAX_RETRIES:
                return False
            entry[1] += 1
            delay = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (entry[1] - 1))
        timer = threading.Timer(delay, self._requeue, (entry[0],))
        timer.daemon = True
        timer.start()
        return True

    def _requeue(self, request: pb.EmbedStreamRequest) -> None:
        with self._changed:
            self._retry.append(request)
            self._changed.notify_all()

    def answered(self, request_id: int) -> None:
        with self._changed:
            self._unanswered.pop(request_id, None)
            self._changed.notify_all()

    def handed_over(self) -> None:
        with self._changed:
            self._free += 1
            self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()


def embed_stream(stub, texts: Iterable[str], **options) -> Iterator[np.ndarray]:
    """One float32 vector [dimension] per text, in input order (see `embed_stream_batches`)."""
    for batch in embed_stream_batches(stub, texts, **options):
        yield from batch
