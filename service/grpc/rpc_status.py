"""The one place where domain errors become gRPC status codes, with per-RPC metrics and call tracking."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError, Message

from bertserve.service import errors
from bertserve.service.core.lifecycle import Lifecycle
from bertserve.service.engine.batcher import DEADLINE_SLACK_S

log = logging.getLogger(__name__)

STATUS_OF_ERROR: dict[type[errors.ServiceError], grpc.StatusCode] = {
    errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ModelNotFound: grpc.StatusCode.NOT_FOUND,
    errors.TaskUnavailable: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.DeadlineTooShort: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.ShuttingDown: grpc.StatusCode.UNAVAILABLE,
    errors.InferenceFailed: grpc.StatusCode.INTERNAL,
}


def status_of(exc: errors.ServiceError) -> grpc.StatusCode:
    for kind in type(exc).__mro__:
        if kind in STATUS_OF_ERROR:
            return STATUS_OF_ERROR[kind]
    return grpc.StatusCode.INTERNAL


Handler = Callable[..., Awaitable[object]]


def parse_request(request_type: type[Message], data: bytes) -> Message:
    try:
        return request_type.FromString(data)
    except DecodeError:
        raise errors.InvalidInput(
            f"request: not a valid {request_type.DESCRIPTOR.full_name} (bad protobuf encoding or invalid UTF-8)"
        ) from None


MAX_STATUS_MESSAGE_BYTES = 1024  # gRPC carries the message in a header; a long one breaks the call


def status_message(message: str) -> str:
    """`message` capped at MAX_STATUS_MESSAGE_BYTES (UTF-8): a status message that quotes client data
    must never exceed gRPC's metadata limit (the client would see RESOURCE_EXHAUSTED "Stream removed"
    while the metrics counted the code the server meant)."""
    data = message.encode("utf-8")
    if len(data) <= MAX_STATUS_MESSAGE_BYTES:
        return message
    cut = data[: MAX_STATUS_MESSAGE_BYTES - 40].decode("utf-8", "ignore")
    return f"{cut}... (message cut from {len(data)} bytes)"


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The call's deadline as the core takes it: absolute time.monotonic() seconds, or None."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def serialized(response: Message | bytes) -> bytes:
    return response if isinstance(response, bytes) else response.SerializeToString()


def check_response_size(response: Message | bytes, limit: int) -> None:
    size = len(response) if isinstance(response, bytes) else response.ByteSize()
    if size > limit:
        raise errors.InvalidInput(
            f"response: {size} bytes is more than max_message_bytes {limit}; ask for less in one call "
            "(fewer or shorter inputs, a smaller top_k)"
        )


def rpc(name: str, request_type: type[Message] | None = None) -> Callable[[Handler], Handler]:
    """Wraps a servicer method: refuses calls while draining (unless `context.admitted`: a transport took
    the call before the drain), maps errors, counts and times calls.

    The servicer must have `metrics` (service.metrics.Metrics), `lifecycle` (Lifecycle) and `settings`
    attributes. A response larger than max_message_bytes is refused here, so the caller learns why and the
    call is counted as failed (gRPC would drop it on sending, after the metrics said OK).
    With `request_type`, a request that arrives as bytes (see `servicer.add_to_server`) is parsed here,
    so an undecodable message (bad wire format, invalid UTF-8) is INVALID_ARGUMENT, not UNKNOWN.
    The method returns a message or its serialized bytes (large responses are serialized off the event
    loop by the servicer); the handler returns bytes: register it with `response_serializer=None`.
    Status messages are capped (`status_message`), so the client sees the code the metrics count.
    """

    def wrap(method: Handler) -> Handler:
        @functools.wraps(method)
        async def handler(self, request, context: grpc.aio.ServicerContext):
            started = time.perf_counter()
            lifecycle: Lifecycle = self.lifecycle
            if not lifecycle.accepting and not getattr(context, "admitted", False):
                self.metrics.requests.labels(name, grpc.StatusCode.UNAVAILABLE.name).inc()
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry elsewhere"
                )
            code, message = grpc.StatusCode.OK, ""
            lifecycle.enter()
            try:
                if request_type is not None and isinstance(request, bytes):
                    request = parse_request(request_type, request)
                response = serialized(await method(self, request, context))
                remaining = context.time_remaining()
                if remaining is not None and remaining <= 0:  # its client has given up: no OK it never gets
                    raise errors.DeadlineTooShort("the deadline passed before the answer was ready")
                check_response_size(response, self.settings.max_message_bytes)
                return response
            except errors.ServiceError as exc:
                code, message = status_of(exc), str(exc)
            except asyncio.CancelledError:  # the client cancelled, or its deadline passed
                remaining = context.time_remaining()
                expired = remaining is not None and remaining <= DEADLINE_SLACK_S
                code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
                raise
            except Exception as exc:
                log.exception("%s failed", name)
                code, message = grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"
            finally:
                lifecycle.leave()
                self.metrics.answered(name, code.name, time.perf_counter() - started)
            await context.abort(code, status_message(message))

        return handler

    return wrap


def parsing(request_type: type[Message], method: Handler) -> Handler:
    """`method(request, context)` fed from bytes, for services that `rpc` does not wrap (grpc.health.v1):
    an undecodable request is INVALID_ARGUMENT there too, not UNKNOWN."""

    async def handler(request: bytes, context: grpc.aio.ServicerContext):
        try:
            message = parse_request(request_type, request)
        except errors.InvalidInput as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, status_message(str(exc)))
        return await method(message, context)

    return handler
