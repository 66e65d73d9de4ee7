"""EmbedStream: bulk embedding over one bidirectional gRPC stream, with flow control.

The client streams EmbedStreamRequests (each with its own id, inputs or token ids, and options as Embed's);
every request becomes one `core.embed` call, admitted to the encoder's queue like any unary call, and its response (with the id)
is sent as soon as it is ready. Two loops per stream:

- the reader reads the next request only while the stream's inputs in flight (admitted, not yet answered
  AND sent) are below `max_stream_inputs_in_flight` and their answers' bytes (each request's worst case
  until it is answered, then its answer's size) below `max_message_bytes` (`StreamWindow`,
  service/grpc/stream_window.py); a request that does not fit waits until it does (one larger than the
  window runs alone). A client that stops reading blocks the writer, the window stays full, the reader
  stops reading, and HTTP/2 flow control stops the client's sends: the stream holds a bounded number of
  inputs and answer bytes whatever its length, its options (token-level, sparse) or its reader's pace. A
  chunked request counts as max_inputs_per_request inputs, the windows its texts may become.
- the writer sends answers in the order they finish and frees their room in the window.

A failed request is answered with its id and a StreamError (code + message, as the unary RPC's status);
the stream goes on, unless its first request set `stop_on_error`: then no more requests are read, those
read are answered (so every request before the failed one gets its answer), and the stream ends with
the failed request's code.
An undecodable request ends the stream with INVALID_ARGUMENT once what was read is answered.

Admission before work: a request's inputs take room in the encoder's stream queue before they are
tokenized (`core.embed(bulk=True)` waits for it in arrival order), so a full queue slows streams down
instead of refusing requests after tokenizing them.

While the server drains, requests read before the drain are answered; a request read after it is
answered at once with a StreamError UNAVAILABLE (no work done); the stream ends with UNAVAILABLE when
every request read is answered and sent and the client either half-closed or sent nothing since the
drain began; at the end of the grace period in any case. The server never ends a stream while a client
that keeps writing still sends: gRPC's asyncio client reports a stream ended under its writes as INTERNAL
"Internal error from Core" and drops the answers it has not read.

The stream's deadline is its gRPC deadline, or sooner the `x-request-timeout` metadata (seconds, as the
HTTP header): at the deadline the server ends the stream with DEADLINE_EXCEEDED itself. A cancelled stream
(client cancel, gRPC deadline) cancels its requests' queued work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import grpc

from bertserve.service import errors
from bertserve.service.core.core import InferenceCore
from bertserve.service.core.lifecycle import Lifecycle
from bertserve.service.engine.batcher import DEADLINE_SLACK_S
from bertserve.service.grpc import v1_messages as messages
from bertserve.service.grpc import wire
from bertserve.service.grpc.embed_options import EmbedArguments, answer_bytes, embed_arguments, options_named
from bertserve.service.grpc.rpc_status import deadline_of, parse_request, status_message, status_of
from bertserve.service.grpc.stream_window import AnswerShape, StreamWindow, answer_reservation
from bertserve.v1 import inference_pb2 as pb

log = logging.getLogger(__name__)

RPC_NAME = "EmbedStream"
TIMEOUT_METADATA = "x-request-timeout"  # seconds, decimal: the stream's deadline if sooner than gRPC's
DRAIN_REFUSAL = "the server is draining: this request was not served; resend it elsewhere"
RESULT_FIELD = pb.EmbedStreamResponse.DESCRIPTOR.fields_by_name["result"].number
OFF_LOOP_BYTES = 64 * 1024  # answers estimated above this are serialized on the CPU pool


@dataclass(frozen=True)
class _Answer:
    request_id: int
    inputs: int  # window share, freed once sent
    answer_bytes: int  # the answer's room in the window, freed once sent
    payload: bytes  # serialized EmbedStreamResponse
    code: grpc.StatusCode
    message: str = ""


@dataclass(frozen=True)
class _ReadingEnded:
    """The reader is done: the client half-closed (code OK), or a request was bad."""

    code: grpc.StatusCode = grpc.StatusCode.OK
    message: str = ""


_WAKE = object()  # in the answers queue: the drain began, or the reader waits for a request


def stream_deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The gRPC deadline, or the `x-request-timeout` metadata's if sooner (time.monotonic() seconds)."""
    deadline = deadline_of(context)
    for key, value in context.invocation_metadata() or ():
        if key == TIMEOUT_METADATA:
            try:
                seconds = float(value)
            except ValueError:
                seconds = -1.0
            if not 0 < seconds < float("inf"):
                raise errors.InvalidInput(
                    f"{TIMEOUT_METADATA}: {value[:40]!r} is not a positive number of seconds"
                )
            mine = time.monotonic() + seconds
            deadline = mine if deadline is None else min(deadline, mine)
    return deadline


def error_payload(request_id: int, code: grpc.StatusCode, message: str) -> bytes:
    error = pb.StreamError(code=code.value[0], message=status_message(message))
    return pb.EmbedStreamResponse(id=request_id, error=error).SerializeToString()


def result_payload(request_id: int, result, floats: bool = True) -> bytes:
    """EmbedStreamResponse holding `result`, joined once (a token-level answer is large)."""
    head = pb.EmbedStreamResponse(id=request_id).SerializeToString()
    parts = messages.embed_parts(result, floats)
    size = sum(len(part) for part in parts)
    tag = wire.varint(RESULT_FIELD << 3 | wire.LENGTH_DELIMITED)
    return b"".join([head, tag, wire.varint(size), *parts])


class _Stream:
    """One EmbedStream call: its reader, writer, window and requests in progress."""

    def __init__(self, core: InferenceCore, lifecycle: Lifecycle, context: grpc.aio.ServicerContext):
        self.core, self.lifecycle, self.context = core, lifecycle, context
        self.settings, self.metrics = core.settings, core.metrics
        self.window = StreamWindow(self.settings.max_stream_inputs_in_flight, self.settings.max_message_bytes)
        self.deadline = stream_deadline(context)
        self.answers: asyncio.Queue[_Answer | _ReadingEnded | object] = asyncio.Queue()
        self.working: set[asyncio.Task] = set()  # requests admitted, not yet answered
        self.stop_on_error = False
        self.answered = 0
        self.reader: asyncio.Task | None = None
        self.draining = False
        self.idle = False  # the reader waits for a request the client has not sent
        self.refused = 0  # requests read after the drain began (answered UNAVAILABLE)
        self.largest = AnswerShape.of(core.info().models)  # for requests that name no model

    async def run(self) -> tuple[grpc.StatusCode, str]:
        self.reader = reader = asyncio.ensure_future(self._read())
        draining = asyncio.ensure_future(self._watch_drain())
        writer = asyncio.ensure_future(self._write())
        closing = asyncio.ensure_future(self.lifecycle.wait_closing())
        timeout = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        try:
            done, _ = await asyncio.wait(
                {writer, closing}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if writer in done:
                return writer.result()
            if closing in done:
                return grpc.StatusCode.UNAVAILABLE, (
                    "the server stopped at the end of its grace period: requests without an answer were "
                    "not served; resend them elsewhere"
                )
            return grpc.StatusCode.DEADLINE_EXCEEDED, "the stream's deadline passed"
        finally:
            tasks = (reader, draining, writer, closing, *self.working)
            for task in tasks:
                task.cancel()
            # let cancelled reads and requests unwind (the core cancels their queued inputs)
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch_drain(self) -> None:
        await self.lifecycle.wait_draining()
        self.draining = True
        self.answers.put_nowait(_WAKE)

    async def _read(self) -> None:
        try:
            await self._read_requests()
        except Exception as exc:  # not cancellation: a failure of ours, reported as the stream's status
            log.exception("EmbedStream reader failed")
            self.answers.put_nowait(
                _ReadingEnded(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
            )

    async def _read_requests(self) -> None:
        first = True
        while True:
            await self.window.wait_room()
            self.idle = True
            if self.draining:
                self.answers.put_nowait(_WAKE)  # the writer may end a stream whose client sends nothing
            data = await self.context.read()
            self.idle = False
            if data is grpc.aio.EOF:
                self.answers.put_nowait(_ReadingEnded())
                return
            try:
                request = parse_request(pb.EmbedStreamRequest, data)
            except errors.InvalidInput as exc:
                self.answers.put_nowait(_ReadingEnded(grpc.StatusCode.INVALID_ARGUMENT, str(exc)))
                return
            del data
            if first:
                self.stop_on_error, first = request.stop_on_error, False
            try:
                arguments = embed_arguments(request)
            except errors.InvalidInput as exc:
                arguments = exc  # answered as the request's error, in its turn
            inputs = max(1, len(request.inputs) + len(request.token_ids))
            if request.options.HasField("chunking"):  # its texts may become this many windows
                inputs = max(inputs, self.settings.max_inputs_per_request)
            reserved = self._reservation(request.model, arguments)
            await self.window.acquire(inputs, reserved)
            if self.draining:  # answered without work, in the window like any answer
                self.refused += 1
                code = grpc.StatusCode.UNAVAILABLE
                payload = error_payload(request.id, code, DRAIN_REFUSAL)
                self.answers.put_nowait(_Answer(request.id, inputs, reserved, payload, code, DRAIN_REFUSAL))
                continue
            self.metrics.stream_inputs_in_flight.observe(self.window.in_flight)
            task = asyncio.ensure_future(self._answer(request, arguments, inputs, reserved))
            self.working.add(task)
            task.add_done_callback(self.working.discard)

    def _reservation(self, model: str, arguments: EmbedArguments | errors.InvalidInput) -> int:
        """Room for the request's answer at its worst (service/grpc/stream_window.py)."""
        if isinstance(arguments, errors.InvalidInput):
            return 0
        try:
            shape = self.largest if not model else AnswerShape.of([self.core.model_info(model)])
        except errors.ServiceError:  # an unknown model: the core refuses the request
            shape = self.largest
        return answer_reservation(arguments, shape, self.settings.max_message_bytes)

    async def _answer(
        self,
        request: pb.EmbedStreamRequest,
        arguments: EmbedArguments | errors.InvalidInput,
        inputs: int,
        reserved: int,
    ) -> None:
        code, message = grpc.StatusCode.OK, ""
        try:
            if isinstance(arguments, errors.InvalidInput):
                raise arguments
            with options_named():
                result = await self.core.embed(
                    request.model,
                    arguments.texts,
                    truncate=request.truncate,
                    deadline=self.deadline,
                    bulk=True,
                    **arguments.keywords(),
                )
            if answer_bytes(result) > OFF_LOOP_BYTES:
                payload = await self.core.off_loop(result_payload, request.id, result, arguments.floats)
            else:
                payload = result_payload(request.id, result, arguments.floats)
            del result
            limit = self.settings.max_message_bytes
            if len(payload) > limit:
                raise errors.InvalidInput(
                    f"response: {len(payload)} bytes is more than max_message_bytes {limit}; send fewer "
                    "inputs per request"
                )
        except errors.ServiceError as exc:
            code, message = status_of(exc), str(exc)
        except Exception as exc:
            log.exception("EmbedStream request %d failed", request.id)
            code, message = grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"
        if code != grpc.StatusCode.OK:
            payload = error_payload(request.id, code, message)
        await self.window.resize(reserved, len(payload))
        self.answers.put_nowait(_Answer(request.id, inputs, len(payload), payload, code, message))

    def _quiet_at_drain(self) -> bool:
        """Draining, every request read is answered and sent, and the client sent nothing since."""
        idle = self.idle and not self.refused and not self.working and self.answers.empty()
        return self.draining and idle

    async def _write(self) -> tuple[grpc.StatusCode, str]:
        ended: _ReadingEnded | None = None
        while ended is None or self.working or not self.answers.empty():
            if ended is None and self._quiet_at_drain():
                self.reader.cancel()
                ended = _ReadingEnded(grpc.StatusCode.UNAVAILABLE, "")
                continue
            item = await self.answers.get()
            if item is _WAKE:
                continue
            if isinstance(item, _ReadingEnded):
                ended = ended or item  # the first reason counts (drain after a half-close changes nothing)
                continue
            await self.context.write(item.payload)
            self.answered += 1
            self.metrics.stream_requests.labels(item.code.name).inc()
            await self.window.release(item.inputs, item.answer_bytes)
            if item.code != grpc.StatusCode.OK and self.stop_on_error and ended is None:
                # read no more; answer what was read (earlier requests included), then end with this error
                self.reader.cancel()
                message = f"request id {item.request_id}: {item.message} (stop_on_error)"
                ended = _ReadingEnded(item.code, message)
        cut = ended.code == grpc.StatusCode.UNAVAILABLE or (ended.code == grpc.StatusCode.OK and self.refused)
        if self.draining and cut:  # a client that half-closed with every request served ends OK
            return grpc.StatusCode.UNAVAILABLE, (
                f"the server is draining: every request read before the drain was answered; "
                f"{self.refused} sent after it were answered UNAVAILABLE; resend those elsewhere"
            )
        return ended.code, ended.message


class EmbedStreamHandler:
    """The EmbedStream method handler (stream-stream, requests and responses as bytes)."""

    def __init__(self, core: InferenceCore, lifecycle: Lifecycle):
        self.core, self.lifecycle, self.metrics = core, lifecycle, core.metrics

    async def handle(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        """A coroutine function (gRPC tells handlers apart by that); requests are read with `context.read()`."""
        started = time.perf_counter()
        if not self.lifecycle.accepting:
            self.metrics.requests.labels(RPC_NAME, grpc.StatusCode.UNAVAILABLE.name).inc()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry elsewhere")
        code, message = grpc.StatusCode.OK, ""
        self.lifecycle.enter()
        self.metrics.streams_open.inc()
        try:
            code, message = await _Stream(self.core, self.lifecycle, context).run()
        except errors.InvalidInput as exc:  # the x-request-timeout metadata
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except asyncio.CancelledError:  # the client cancelled, or the stream's deadline passed
            remaining = context.time_remaining()
            expired = remaining is not None and remaining <= DEADLINE_SLACK_S
            code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            log.exception("EmbedStream failed")
            code, message = grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"
        finally:
            self.lifecycle.leave()
            self.metrics.streams_open.dec()
            self.metrics.requests.labels(RPC_NAME, code.name).inc()
            self.metrics.request_duration.labels(RPC_NAME).observe(time.perf_counter() - started)
        if code != grpc.StatusCode.OK:
            await context.abort(code, status_message(message))


def method_handler(core: InferenceCore, lifecycle: Lifecycle) -> grpc.RpcMethodHandler:
    return grpc.stream_stream_rpc_method_handler(
        EmbedStreamHandler(core, lifecycle).handle, request_deserializer=None, response_serializer=None
    )
