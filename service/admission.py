"""Admission of gRPC calls: at most `max_concurrent_rpcs` in flight; the excess is refused at once with
RESOURCE_EXHAUSTED and counted in `bertserve_requests_total{rpc, code="RESOURCE_EXHAUSTED"}`.

A server interceptor rather than gRPC's own `maximum_concurrent_rpcs` option: gRPC refuses those calls
before any Python code sees them, so no metric could count them. grpc.health.v1 Check is never refused
(probes must answer under load). Calls that gRPC's core holds before the application asks for them are
bounded by `PENDING_CALLS` (gRPC's default, 1,000 soft and 3,000 hard, cancelled about half of a burst
of 3,000 calls with CANCELLED before any handler saw them, uncounted).

When the last unary call in flight finishes and none starts for IDLE_RELEASE_S, the heap's free pages are
handed back to the kernel (`memory.release_free_memory`): glibc keeps what a large request freed, so RSS
would stay at its peak at idle.
"""

from __future__ import annotations

import asyncio
import inspect
import logging

import grpc

from bertserve.service.memory import release_free_memory
from bertserve.service.metrics import Metrics

log = logging.getLogger(__name__)

# Calls gRPC's core may hold before the server takes them (each is then admitted or refused).
PENDING_CALLS = 1 << 16
IDLE_RELEASE_S = 0.5
NEVER_REFUSED = frozenset({"/grpc.health.v1.Health/Check"})


def server_options(max_concurrent_rpcs: int) -> list[tuple[str, int]]:
    """gRPC server options that let every call reach `Admission` (which then bounds them)."""
    pending = max(PENDING_CALLS, 2 * max_concurrent_rpcs)
    return [
        ("grpc.server.max_pending_requests", pending),
        ("grpc.server.max_pending_requests_hard_limit", pending),
    ]


class Admission(grpc.aio.ServerInterceptor):
    def __init__(self, limit: int, metrics: Metrics):
        self.limit = limit
        self.metrics = metrics
        self.in_flight = 0  # every admitted call, streams included
        self._unary_in_flight = 0
        self._started = 0  # unary calls admitted so far: the idle release runs once per quiet spell
        self._released_at = 0

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method in NEVER_REFUSED:
            return handler
        if self.in_flight >= self.limit:
            rpc = details.method.rsplit("/", 1)[-1]
            self.metrics.requests.labels(rpc, grpc.StatusCode.RESOURCE_EXHAUSTED.name).inc()
            return _refusal(handler, self.limit)
        return self._tracked(handler)

    def _tracked(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.unary_unary is not None:
            behaviour = handler.unary_unary

            async def unary_unary(request, context):
                self._enter(unary=True)
                try:
                    return await behaviour(request, context)
                finally:
                    self._leave(unary=True)

            return handler._replace(unary_unary=unary_unary)
        if handler.unary_stream is not None and not inspect.isasyncgenfunction(handler.unary_stream):
            behaviour = handler.unary_stream

            async def unary_stream(request, context):
                self._enter(unary=False)
                try:
                    return await behaviour(request, context)
                finally:
                    self._leave(unary=False)

            return handler._replace(unary_stream=unary_stream)
        return handler  # streams of other shapes are not served here

    def _enter(self, unary: bool) -> None:
        self.in_flight += 1
        if unary:
            self._unary_in_flight += 1
            self._started += 1

    def _leave(self, unary: bool) -> None:
        self.in_flight -= 1
        if unary:
            self._unary_in_flight -= 1
            if self._unary_in_flight == 0:
                asyncio.get_running_loop().call_later(IDLE_RELEASE_S, self._release_if_idle, self._started)

    def _release_if_idle(self, started: int) -> None:
        if self._unary_in_flight == 0 and self._started == started and self._released_at != started:
            self._released_at = started
            asyncio.get_running_loop().run_in_executor(None, release_free_memory)


def _refusal(handler: grpc.RpcMethodHandler, limit: int) -> grpc.RpcMethodHandler:
    message = f"the server has max_concurrent_rpcs {limit} calls in flight; retry later"

    async def refuse(request, context):
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)

    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse)
    return grpc.stream_stream_rpc_method_handler(refuse)
