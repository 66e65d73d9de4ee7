"""A unary call's request message on the main port, read by bertserve instead of by gRPC before the handler.

gRPC's Python server reads a unary request before it calls the handler, growing the stream's HTTP/2 window
to the message's size, and has no byte quota (its C++ server's ResourceQuota is not reachable from Python):
clients that start large messages and never finish them would hold gigabytes, for as long as they like.
Here the handler is given to gRPC as a stream-request method (the same call on the wire; `as_streamed`) and
reads the one message itself (`RequestReads.read`):
- a message whole within RECEIVE_GRACE_S costs nothing more (every small one: the client's first 64 KiB
  wait in gRPC's buffer before anyone reads; the decision waits for the loop's pending wake-ups, so a
  loop that was busy past the grace does not take a message that came for one still arriving);
- one still arriving after that holds room for a whole message (`max_message_bytes`) in a budget of
  `max_request_bytes_in_flight` until it is whole; with no room the call ends at once with
  RESOURCE_EXHAUSTED (gRPC then resets the stream, which stops its bytes). Clients that start messages and
  stall can so keep other slow or large messages out (retry later) for up to the read timeout, never small
  ones, and hold at most that budget;
- it must be whole within `http_read_timeout_s`, else DEADLINE_EXCEEDED; a call without one is
  INVALID_ARGUMENT.
The call is ended from a task of its own (`context.abort`), so the read that waits for the message returns
through gRPC's own path (the AbortError of an aborted call), never cancelled half-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable

import grpc

from bertserve.service.metrics import Metrics

RECEIVE_GRACE_S = 0.05
UNCOUNTED_READS = 64  # reads of calls never counted in flight (health Check) at once; beyond: refused
# a unary-request handler shape -> the stream-request shape it is given to gRPC as
AS_STREAMED = {"unary_unary": "stream_unary", "unary_stream": "stream_stream"}


def as_streamed(handler: grpc.RpcMethodHandler, wrap: Callable) -> grpc.RpcMethodHandler:
    """`handler` (unary request) as a stream-request handler whose behaviour is `wrap(behaviour)`."""
    for unary, streamed in AS_STREAMED.items():
        behaviour = getattr(handler, unary)
        if behaviour is not None:
            return handler._replace(request_streaming=True, **{unary: None, streamed: wrap(behaviour)})
    return handler


def around(behaviour, session: Callable):
    """`behaviour(argument, context)` (a coroutine function or an async generator) run inside
    `session(argument, context)`, an async context manager that gives the argument to pass on."""
    if inspect.isasyncgenfunction(behaviour):

        async def generator(argument, context):
            async with session(argument, context) as passed:
                async for response in behaviour(passed, context):
                    yield response

        return generator

    async def coroutine(argument, context):
        async with session(argument, context) as passed:
            return await behaviour(passed, context)

    return coroutine


class RequestReads:
    def __init__(self, budget_bytes: int, message_bytes: int, timeout_s: float, metrics: Metrics):
        self.limit = budget_bytes
        self.message_bytes = min(message_bytes, budget_bytes)
        self.timeout_s = max(timeout_s, RECEIVE_GRACE_S)
        self.metrics = metrics
        self.used = 0  # bytes of room held by messages still arriving
        self.uncounted = 0  # reads under way for calls never counted in flight
        self.ending: set[asyncio.Task] = set()  # calls being ended (the loop holds tasks only weakly)

    def streamed(self, handler: grpc.RpcMethodHandler, rpc: str) -> grpc.RpcMethodHandler:
        """`handler` (unary request) reading its message here, for calls that admission never counts in
        flight (health Check): at most UNCOUNTED_READS at once, so their grace is bounded too."""

        @contextlib.asynccontextmanager
        async def session(requests, context):
            if self.uncounted >= UNCOUNTED_READS:
                await self.end(
                    context, rpc, grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self.uncounted} {rpc} calls are being read; retry later",
                )  # fmt: skip
            self.uncounted += 1
            try:
                request = await self.read(context, rpc)
            finally:
                self.uncounted -= 1
            yield request

        return as_streamed(handler, lambda behaviour: around(behaviour, session))

    async def read(self, context: grpc.aio.ServicerContext, rpc: str):
        """The call's one request message (deserialized); the call ends (the exception gRPC expects) with
        the status that says why when it does not come whole."""
        waiting = _Waiting(self, context, rpc)
        try:
            request = await context.read()
        finally:
            waiting.close()
        if request is grpc.aio.EOF or request is None:
            await self.end(
                context, rpc, grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message"
            )
        return request

    async def end(self, context: grpc.aio.ServicerContext, rpc: str, code: grpc.StatusCode, message: str):
        """Ends the call with `code`, counted in bertserve_requests_total when that is what the client gets."""
        try:
            await context.abort(code, message)
        except grpc.aio.AbortError:
            self.metrics.requests.labels(rpc, code.name).inc()
            raise


class _Waiting:
    """One message being read: its timer (the grace, then the read timeout) and the room it holds."""

    def __init__(self, reads: RequestReads, context: grpc.aio.ServicerContext, rpc: str):
        self.reads, self.context, self.rpc = reads, context, rpc
        self.held = 0
        self.closed = False  # the read is over: a timer's task that runs after that ends nothing
        self.loop = asyncio.get_running_loop()
        self.timer: asyncio.Handle = self.loop.call_later(RECEIVE_GRACE_S, self._graced)

    def _graced(self) -> None:
        # after the wake-ups already due (a message that came while the loop was busy is taken first)
        self.timer = self.loop.call_soon(self._decide)

    def _decide(self) -> None:
        reads = self.reads
        if reads.used and reads.used + reads.message_bytes > reads.limit:  # a lone message always fits
            self._end(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"request messages still arriving hold {reads.used} bytes of max_request_bytes_in_flight "
                f"{reads.limit}; retry later",
            )
            return
        self.held = reads.message_bytes
        reads.used += self.held
        self.timer = self.loop.call_later(
            reads.timeout_s - RECEIVE_GRACE_S,
            self._end,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"the request message did not arrive within http_read_timeout_s {reads.timeout_s:g} s",
        )

    def _end(self, code: grpc.StatusCode, message: str) -> None:
        async def end() -> None:
            if self.closed:  # the message came in the same turn of the loop (its wake-up ran first)
                return
            with contextlib.suppress(grpc.aio.BaseError, asyncio.CancelledError):  # an ended call too
                await self.reads.end(self.context, self.rpc, code, message)

        task = asyncio.ensure_future(end())
        self.reads.ending.add(task)
        task.add_done_callback(self.reads.ending.discard)

    def close(self) -> None:
        """The read is over: the timer stops and the room comes back."""
        self.closed = True
        self.timer.cancel()
        self.reads.used -= self.held
        self.held = 0
