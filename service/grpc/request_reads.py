"""A unary call's request message on the main port, read by bertserve instead of by gRPC before the handler.

gRPC's Python server reads a unary request before it calls the handler, growing the stream's HTTP/2 window
to the message's size, and has no byte quota (its C++ server's ResourceQuota is not reachable from Python):
clients that start large messages and never finish them would hold gigabytes, for as long as they like.
Here the handler is given to gRPC as a stream-request method (the same call on the wire) and reads the one
message itself:
- a message whole within RECEIVE_GRACE_S (every small one: the client's first 64 KiB wait in gRPC's buffer
  before anyone reads) costs nothing more;
- one still arriving after that holds room for a whole message (`max_message_bytes`) in a budget of
  `max_request_bytes_in_flight` until it is whole; with no room the call ends at once with
  RESOURCE_EXHAUSTED (which stops its bytes), so slow or unfinished senders hold at most that budget and
  never hold up small calls;
- it must be whole within `http_read_timeout_s` (and the call's deadline), else DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable

import grpc

from bertserve.service.engine.queue_room import LaneRoom, Permit

RECEIVE_GRACE_S = 0.05
# The stream-request handler each unary shape becomes, and the grpc constructor of that handler.
AS_STREAMED = {"unary_unary": "stream_unary", "unary_stream": "stream_stream"}


class RequestReads:
    """Reads the request of the unary calls of the handlers passed through `streamed`; `count(rpc, code)`
    counts a call this ends."""

    def __init__(
        self, budget_bytes: int, message_bytes: int, timeout_s: float, count: Callable[[str, str], None]
    ):
        self.room = LaneRoom(budget_bytes)
        self.message_bytes = min(message_bytes, budget_bytes)
        self.timeout_s = timeout_s
        self.count = count

    def streamed(self, handler: grpc.RpcMethodHandler, rpc: str) -> grpc.RpcMethodHandler:
        """`handler` (unary request) as a stream-request handler that reads its message here first."""
        for unary, streamed in AS_STREAMED.items():
            behaviour = getattr(handler, unary)
            if behaviour is not None:
                return handler._replace(
                    request_streaming=True, **{unary: None, streamed: self._reading(behaviour, rpc)}
                )
        return handler

    def _reading(self, behaviour, rpc: str):
        if inspect.isasyncgenfunction(behaviour):

            async def generator(requests, context):
                request = await self.read(context, rpc)
                async for response in behaviour(request, context):
                    yield response

            return generator

        async def coroutine(requests, context):
            return await behaviour(await self.read(context, rpc), context)

        return coroutine

    async def read(self, context: grpc.aio.ServicerContext, rpc: str):
        """The call's one request message (deserialized), or the call ended with the status that says why."""
        waiting = _Waiting(asyncio.current_task())
        waiting.timer = asyncio.get_running_loop().call_later(RECEIVE_GRACE_S, self._graced, waiting)
        try:
            request = await context.read()
        except asyncio.CancelledError:
            if waiting.ending is None:
                raise  # the call was cancelled
            if hasattr(waiting.task, "uncancel"):  # Python 3.11+: the cancel was ours, not the caller's
                waiting.task.uncancel()
            await self._end(context, rpc, *waiting.ending)
        finally:
            waiting.timer.cancel()
            if waiting.permit is not None:
                waiting.permit.release()
        if request is grpc.aio.EOF:
            await self._end(
                context, rpc, grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message"
            )
        return request

    def _graced(self, waiting: _Waiting) -> None:
        """The grace is over and the message is still arriving (or came in this turn of the loop: its room
        is then given back at once): it holds room for a whole message until it is whole (a lone message
        always fits), or the call ends."""
        if self.room.used and not self.room.fits(self.message_bytes):
            waiting.end(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"request messages still arriving hold {self.room.used} bytes of max_request_bytes_in_flight "
                f"{self.room.limit}; retry later",
            )
            return
        waiting.permit = self.room.take(self.message_bytes)
        waiting.timer = asyncio.get_running_loop().call_later(
            self.timeout_s - RECEIVE_GRACE_S,
            waiting.end,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"the request message did not arrive within http_read_timeout_s {self.timeout_s:g} s",
        )

    async def _end(self, context: grpc.aio.ServicerContext, rpc: str, code: grpc.StatusCode, message: str):
        self.count(rpc, code.name)
        await context.abort(code, message)


class _Waiting:
    """A request being read by `task` (the call's): its timer (the grace, then the read timeout), its room,
    and why it ends."""

    __slots__ = ("task", "timer", "permit", "ending")

    def __init__(self, task: asyncio.Task):
        self.task = task
        self.timer: asyncio.TimerHandle | None = None
        self.permit: Permit | None = None
        self.ending: tuple[grpc.StatusCode, str] | None = None

    def end(self, code: grpc.StatusCode, message: str) -> None:
        """Stops the wait for the message: the call's task is cancelled, and `read` ends the call with `code`."""
        if self.ending is None:
            self.ending = (code, message)
            self.task.cancel()
