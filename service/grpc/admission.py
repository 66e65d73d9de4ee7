"""Admission of gRPC calls: at most `max_concurrent_rpcs` in flight, of which at most
`max_concurrent_streams` with streamed requests (EmbedStream, reflection); the excess is refused at once
with RESOURCE_EXHAUSTED naming the limit and counted in `bertserve_requests_total{rpc, code}`. Calls
with one request message hold it until they end: a call whose message would take the bytes held past
`max_request_bytes_in_flight` is refused the same way (a lone call is always admitted, as gRPC already
bounds one message by `max_message_bytes`). A unary call's message is read here, once the call is counted
in flight, within a budget of its own for messages still arriving (service/grpc/request_reads.py).

A server interceptor rather than gRPC's own `maximum_concurrent_rpcs` option: gRPC refuses those calls
before any Python code sees them, so no metric could count them. grpc.health.v1 Check is never refused
(probes must answer under load). Calls that gRPC's core holds before the application asks for them are
bounded by `PENDING_CALLS` (gRPC's default, 1,000 soft and 3,000 hard, cancelled about half of a burst
of 3,000 calls with CANCELLED before any handler saw them, uncounted).

A stream's memory is bounded by its window (service/grpc/streaming.py) and by what gRPC's core reads ahead of
it: `server_options` turns off the bandwidth-delay probing that grows each stream's receive window to
megabytes, so a stream that is not read from buffers at most HTTP/2's initial window (64 KiB) plus the
message the server is reading.

When the last call in flight (unary or streamed requests; health Watch streams aside) finishes and none
starts for IDLE_RELEASE_S, the heap's free pages are handed back to the kernel
(`memory.IdleRelease`): glibc keeps what large requests freed, so RSS would stay at its peak.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import grpc

from bertserve.service.grpc.request_reads import RequestReads, around, as_streamed
from bertserve.service.memory import IdleRelease
from bertserve.service.metrics import Metrics

log = logging.getLogger(__name__)

# Calls gRPC's core may hold before the server takes them (each is then admitted or refused).
PENDING_CALLS = 1 << 16
NEVER_REFUSED = frozenset({"/grpc.health.v1.Health/Check"})


def server_options(max_concurrent_rpcs: int) -> list[tuple[str, int]]:
    """gRPC server options that let every call reach `Admission` (which then bounds them)."""
    pending = max(PENDING_CALLS, 2 * max_concurrent_rpcs)
    return [
        ("grpc.server.max_pending_requests", pending),
        ("grpc.server.max_pending_requests_hard_limit", pending),
        # windows stay at their initial size: a stream nobody reads holds its window, not megabytes
        ("grpc.http2.bdp_probe", 0),
    ]


class Admission(grpc.aio.ServerInterceptor):
    def __init__(
        self, limit: int, metrics: Metrics, reads: RequestReads, stream_limit: int | None = None,
        bytes_limit: int | None = None,
    ):  # fmt: skip
        """`reads`: what reads unary calls' request messages (service/grpc/request_reads.py)."""
        self.limit = limit
        self.reads = reads
        self._wrapped: dict[str, tuple] = {}  # method -> (gRPC's handler, the one served for it)
        self.stream_limit = limit if stream_limit is None else stream_limit
        self.bytes_limit = bytes_limit
        self.metrics = metrics
        self.in_flight = 0  # every admitted call, streams included
        self.streams = 0  # admitted calls whose requests are streamed (client-streaming, bidirectional)
        self.request_bytes = 0  # serialized size of the request messages held by admitted unary calls
        self._idle = IdleRelease()  # calls in flight but Watch streams: the heap goes back when none is

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method
        rpc = method.rsplit("/", 1)[-1]
        message = None if method in NEVER_REFUSED else self._full(handler.request_streaming)
        if message is not None:
            self._count_refusal(rpc)
            return _refusal(handler, message)
        wrapped = self._wrapped.get(method)
        if wrapped is None or wrapped[0] is not handler:  # each method's handler wrapped once
            if method in NEVER_REFUSED:
                served = handler if handler.request_streaming else self.reads.streamed(handler, rpc)
            else:
                served = self._tracked(handler, rpc)
            wrapped = self._wrapped[method] = (handler, served)
        return wrapped[1]

    def _full(self, stream: bool) -> str | None:
        """Why a call (`stream`: with streamed requests) is refused now; None: it may start."""
        if self.in_flight >= self.limit:
            return f"the server has max_concurrent_rpcs {self.limit} calls in flight; retry later"
        if stream and self.streams >= self.stream_limit:
            return f"the server has max_concurrent_streams {self.stream_limit} streams open; retry later"
        return None

    def _count_refusal(self, rpc: str) -> None:
        self.metrics.requests.labels(rpc, grpc.StatusCode.RESOURCE_EXHAUSTED.name).inc()

    def _tracked(self, handler: grpc.RpcMethodHandler, rpc: str) -> grpc.RpcMethodHandler:
        """The handler, counted in flight while its behaviour runs (every shape: coroutine functions and
        async generators); a unary request is read here, after the call is counted and before its bytes
        are (service/grpc/request_reads.py). Calls checked in `intercept_service` together may all start:
        the limits are checked again as the behaviour starts, and the excess refused then."""
        releasing = handler.request_streaming or not handler.response_streaming  # Watch streams: not
        if not handler.request_streaming:
            session = functools.partial(self._unary_call, releasing=releasing, rpc=rpc)
            return as_streamed(handler, lambda behaviour: around(behaviour, session))
        session = functools.partial(self._streamed_call, releasing=releasing, rpc=rpc)
        kind = "stream_unary" if handler.stream_unary is not None else "stream_stream"
        return handler._replace(**{kind: around(getattr(handler, kind), session)})

    @contextlib.asynccontextmanager
    async def _unary_call(self, requests, context, releasing: bool, rpc: str):
        """A unary call: counted in flight, its request read, its bytes held (or the call refused)."""
        await self._enter(context, releasing, False, rpc)
        size = 0
        try:
            request = await self.reads.read(context, rpc)
            size = await self._hold(context, rpc, request)
            yield request
        finally:
            self._leave(releasing, False, size)

    @contextlib.asynccontextmanager
    async def _streamed_call(self, requests, context, releasing: bool, rpc: str):
        """A call with streamed requests, counted in flight and among the streams."""
        await self._enter(context, releasing, True, rpc)
        try:
            yield requests
        finally:
            self._leave(releasing, True, 0)

    async def _enter(self, context, releasing: bool, stream: bool, rpc: str) -> None:
        """Counts the call in flight, or refuses it (RESOURCE_EXHAUSTED) when the limits are reached."""
        message = self._full(stream)
        if message is not None:
            self._count_refusal(rpc)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        self.in_flight += 1
        self.streams += stream
        if releasing:
            self._idle.begin()

    async def _hold(self, context, rpc: str, request) -> int:
        """Holds the request's bytes (returned), or refuses the call past max_request_bytes_in_flight."""
        size = 0 if self.bytes_limit is None else _message_size(request)
        if size and self.request_bytes and self.request_bytes + size > self.bytes_limit:
            self._count_refusal(rpc)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"requests in flight hold {self.request_bytes} bytes; this one ({size} bytes) would pass "
                f"max_request_bytes_in_flight {self.bytes_limit}; retry later",
            )
        self.request_bytes += size
        return size

    def _leave(self, releasing: bool, stream: bool, size: int) -> None:
        self.request_bytes -= size
        self.in_flight -= 1
        self.streams -= stream
        if releasing:
            self._idle.end()


def _message_size(request) -> int:
    """A request's serialized size: bertserve's handlers take the raw bytes and parse them themselves."""
    if isinstance(request, bytes | bytearray | memoryview):
        return len(request)
    return request.ByteSize() if hasattr(request, "ByteSize") else 0


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """Refuses without reading the request (a stream-request handler: gRPC reads nothing before it)."""

    async def refuse(requests, context):
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    return grpc.stream_unary_rpc_method_handler(refuse)
