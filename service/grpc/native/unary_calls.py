"""The native port's calls that are not plain Embed (every other unary method of the main port, and Embed
with `options` or `token_ids`): each is answered by the main port's own handler for its method, so the
checks, status codes, metrics and drain refusal are the main port's. The handlers are recorded as the
servicers register them (`HandlerTable`) and run with `NativeContext`, the part of gRPC's servicer
context they use: the deadline and `abort`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from bertserve.service.grpc.rpc_status import status_message

log = logging.getLogger(__name__)
INTERNAL = grpc.StatusCode.INTERNAL.value[0]


@dataclass(frozen=True)
class _Details:  # grpc.HandlerCallDetails as a generic handler reads it
    method: str
    invocation_metadata: tuple = ()


class HandlerTable:
    """Stands in for the main gRPC server while the servicers register: records their generic handlers
    and passes them on, so the native port can run the same handlers."""

    def __init__(self, server: grpc.aio.Server):
        self.server = server
        self._generic: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        handlers = tuple(handlers)
        self._generic.extend(handlers)
        self.server.add_generic_rpc_handlers(handlers)

    def unary(self, services: Iterable[ServiceDescriptor]) -> dict[str, grpc.RpcMethodHandler]:
        """Full method name -> its handler, for every unary-unary method of `services` registered here."""
        found = {}
        for service in services:
            for method in service.methods:
                if method.client_streaming or method.server_streaming:
                    continue
                name = f"/{service.full_name}/{method.name}"
                for generic in self._generic:
                    handler = generic.service(_Details(name))
                    if handler is not None:
                        found[name] = handler
                        break
        return found


class Aborted(Exception):
    """A handler ended its call with a status (`NativeContext.abort`)."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(code, details)
        self.code, self.details = code, details


class NativeContext:
    """What the main port's unary handlers ask of their context, for a call held by the native transport."""

    # the transport admitted the call before any drain (it refuses new calls from then on): `rpc` answers it
    admitted = True

    def __init__(self, deadline: float | None, expired: Callable[[], bool] = lambda: False):
        self._deadline = deadline  # time.monotonic() seconds, None: none
        self._expired = expired  # the transport ended the call for its deadline (its clock ran first)

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return 0.0 if self._expired() else max(0.0, self._deadline - time.monotonic())

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        raise Aborted(code, details)

    def invocation_metadata(self) -> tuple:
        return ()

    def peer(self) -> str:
        return "native"


@dataclass
class UnaryCall:
    """One call for `run`: its method's handler and its request (bytes, or the message already parsed)."""

    id: int
    rpc: str  # the method's short name, as the metrics label it
    handler: grpc.RpcMethodHandler
    request: object
    deadline: float | None
    started: bool = False  # the handler began (it counts the call from then on)


def run(
    call: UnaryCall,
    on_done: Callable[[UnaryCall, asyncio.Task], None],
    ended: Callable[[int], grpc.StatusCode | None] = lambda _: None,
) -> asyncio.Task:
    """Runs the call's handler in a task; `on_done(call, task)` once it ends. The task's result is the
    reply's bytes; `Aborted` says the status the handler ended the call with. `ended(id)`: how the transport
    ended a call it dropped (a deadline it saw pass is the handler's DEADLINE_EXCEEDED, never CANCELLED)."""
    expired = lambda: ended(call.id) is grpc.StatusCode.DEADLINE_EXCEEDED  # noqa: E731

    async def answer() -> bytes:
        call.started = True
        reply = await call.handler.unary_unary(call.request, NativeContext(call.deadline, expired))
        serialize = call.handler.response_serializer
        return reply if isinstance(reply, bytes) or serialize is None else serialize(reply)

    task = asyncio.ensure_future(answer())
    task.add_done_callback(lambda done: on_done(call, done))
    return task


def answer(transport, call: UnaryCall, task: asyncio.Task | None, ended: grpc.StatusCode | None):
    """Hands the call's reply or status to `transport` (`task`: its handler's, None when it never ran;
    `ended`: how the transport ended it, if it did). Returns the status to count for a call whose handler
    never started (it counts the others), else None. Never raises: a failure still ends the call."""
    try:
        if task is None or task.cancelled():  # its client left, or the server is stopping
            # a started handler counted the cancel as CANCELLED: the client sees that; else UNAVAILABLE
            stopped = grpc.StatusCode.CANCELLED if call.started else grpc.StatusCode.UNAVAILABLE
            if ended is None:
                transport.fail(call.id, stopped.value[0], "the server is stopping")
            return None if call.started else ended or stopped
        failure = task.exception()
        if failure is None:
            transport.reply(call.id, task.result())
        elif isinstance(failure, Aborted):
            transport.fail(call.id, failure.code.value[0], status_message(failure.details))
        else:
            log.error("native %s failed: %r", call.rpc, failure)
            transport.fail(call.id, INTERNAL, f"internal error: {type(failure).__name__}")
    except Exception as exc:  # the call is still ended, so its client never waits for its deadline
        log.error("native %s: answering failed: %r", call.rpc, exc)
        with contextlib.suppress(Exception):
            transport.fail(call.id, INTERNAL, f"internal error: {type(exc).__name__}")
    return None
