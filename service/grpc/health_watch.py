"""grpc.health.v1 Watch streams that end when the server drains.

grpc_health's `HealthServicer.Watch` never returns: its streams stay open until gRPC cancels them when the
server stops, and those cancelled at the very end (a client that hangs up during the drain, or streams
still open when the event loop closes) are logged by gRPC as ERROR with tracebacks, one per stream. Here
each stream is watched beside an event; at the drain (`end_all`) every stream gets NOT_SERVING and ends
with UNAVAILABLE ("the server is shutting down"), as a call refused during the drain does, so no stream
is left for the stop to cancel. The drain's own NOT_SERVING may have started a write of the Watch when it is
cancelled: that write is finished before the last one starts (gRPC refuses two at once on a call).
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

ENDED = "the server is shutting down; watch another server"


class WatchStreams:
    def __init__(self, health: HealthServicer):
        self._health = health
        self._ending = asyncio.Event()

    def end_all(self) -> None:
        self._ending.set()

    async def watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> None:
        writes = _FinishedWrites(context)
        watching = asyncio.ensure_future(self._health.Watch(request, writes))
        ending = asyncio.ensure_future(self._ending.wait())
        try:
            await asyncio.wait((watching, ending), return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the client cancels: neither task outlives the call
            for task in (watching, ending):
                task.cancel()
            await asyncio.gather(watching, ending, return_exceptions=True)
        if not watching.cancelled() and watching.exception() is not None:
            raise watching.exception()
        if writes.pending is not None:  # the Watch was cancelled while writing
            await asyncio.gather(writes.pending, return_exceptions=True)
        await context.write(health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING))
        await context.abort(grpc.StatusCode.UNAVAILABLE, ENDED)


class _FinishedWrites:
    """The Watch's context, whose writes run to their end even when the Watch is cancelled during one."""

    def __init__(self, context: grpc.aio.ServicerContext):
        self._context = context
        self.pending: asyncio.Future | None = None  # the last write

    async def write(self, message) -> None:
        self.pending = asyncio.ensure_future(self._context.write(message))
        await asyncio.shield(self.pending)

    def __getattr__(self, name: str):
        return getattr(self._context, name)
