"""bertserve.v1 `Embed` on a port of its own (setting `native_port`), through the native transport: gRPC's
C++ server holds the calls, one thread takes them in groups, the core checks and tokenizes a group at once
(service/core/embed_groups.py) and the event loop admits each call to the same encoder queues as the
main port's calls, so they share batches. Python's work per call is its request's parsing and its reply's
building; the rest is per group.

Plain calls only (inputs, model, normalize, truncate): a call with `options` or `token_ids` gets
INVALID_ARGUMENT naming the field, any other method UNIMPLEMENTED (the main port serves everything)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import grpc

from bertserve.service import errors
from bertserve.service.core.embed_groups import EmbedGroups, PlainEmbed, Prepared
from bertserve.service.core.lifecycle import Lifecycle
from bertserve.service.core.results import EmbedResult
from bertserve.service.grpc import v1_messages as messages
from bertserve.service.grpc.native.transport import NativeTransport, TakenCall
from bertserve.service.grpc.rpc_status import check_response_size, parse_request, status_message, status_of
from bertserve.service.settings import Settings
from bertserve.v1 import inference_pb2 as pb

log = logging.getLogger(__name__)

METHODS = ["/bertserve.v1.Inference/Embed"]
TAKE_WAIT_S = 0.1  # the taker's longest wait for calls (how soon it sees a stop)
DRAIN_POLL_S = 0.01  # while draining: how often the calls still held are counted
UNARY_FIELDS = ("options", "token_ids")  # an Embed request's fields this port refuses


class NativeFront:
    def __init__(self, core, settings: Settings, lifecycle: Lifecycle):
        self.core, self.settings, self.lifecycle = core, settings, lifecycle
        self.metrics = core.metrics
        self.groups = EmbedGroups(core)
        self.transport: NativeTransport | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self, host: str, port: int, tls: tuple[bytes, bytes, bytes] | None) -> int:
        """Listens (building the transport on first use) and starts taking calls; returns the port."""
        s = self.settings
        self._loop = asyncio.get_running_loop()
        self.transport = await self._loop.run_in_executor(
            None,
            lambda: NativeTransport(
                f"{host}:{port}", METHODS, s.max_queue_inputs, s.max_message_bytes, s.concurrent_rpcs_limit(), tls,
            ),
        )  # fmt: skip
        self._thread = threading.Thread(target=self._take, name="bertserve-native", daemon=True)
        self._thread.start()
        return self.transport.port

    def _take(self) -> None:
        """The taker thread: each group of calls parsed, checked and tokenized here, then admitted on the
        event loop."""
        limit = self.settings.max_batch_size
        while (calls := self.transport.take(TAKE_WAIT_S, limit)) is not None:
            if not calls:
                continue
            started = time.perf_counter()
            plain, taken = [], []
            for call in calls:
                try:
                    plain.append(self._plain(call))
                    taken.append(call.id)
                except errors.ServiceError as exc:  # never entered the lifecycle
                    self._fail(call.id, exc, started)
            try:
                prepared = self.groups.prepare(plain)
            except Exception as exc:  # answered, so no call hangs
                log.exception("native Embed: preparing calls failed")
                prepared = [errors.InferenceFailed(f"internal error: {type(exc).__name__}")] * len(plain)
            self._loop.call_soon_threadsafe(self._submit, taken, prepared, started)

    def _plain(self, call: TakenCall) -> PlainEmbed:
        request = parse_request(pb.EmbedRequest, call.request)
        for name in UNARY_FIELDS:
            if request.HasField(name) if name == "options" else len(getattr(request, name)):
                raise errors.InvalidInput(
                    f"{name}: the native port answers plain Embed calls (inputs, model, normalize, "
                    "truncate); send this call to the main port"
                )
        deadline = None if call.timeout_s is None else time.monotonic() + call.timeout_s
        normalize = request.normalize if request.HasField("normalize") else None
        return PlainEmbed(request.model, list(request.inputs), normalize, request.truncate, deadline)

    def _submit(self, ids: list[int], prepared: list[Prepared | errors.ServiceError], started: float) -> None:
        for call, one in zip(ids, prepared, strict=True):
            self.lifecycle.enter()  # left in `_answer`
            if isinstance(one, errors.ServiceError):
                self._answer(call, started, one)
            else:
                self.groups.submit(one, lambda result, call=call: self._answer(call, started, result))

    def _answer(self, call: int, started: float, result: EmbedResult | BaseException) -> None:
        """On the loop: the call's reply (or status) handed to the transport; the call leaves the lifecycle."""
        try:
            if isinstance(result, EmbedResult):
                try:
                    data = messages.embed(result)
                    check_response_size(data, self.settings.max_message_bytes)
                except errors.ServiceError as exc:
                    self._fail(call, exc, started)
                else:
                    self.transport.reply(call, data)
                    self.metrics.answered("Embed", grpc.StatusCode.OK.name, time.perf_counter() - started)
            elif isinstance(result, errors.ServiceError):
                self._fail(call, result, started)
            else:
                log.error("native Embed failed: %r", result)
                self._fail(call, errors.InferenceFailed(f"internal error: {type(result).__name__}"), started)
        finally:
            self.lifecycle.leave()

    def _fail(self, call: int, exc: errors.ServiceError, started: float) -> None:
        code = status_of(exc)
        self.transport.fail(call, code.value[0], status_message(str(exc)))
        self.metrics.answered("Embed", code.name, time.perf_counter() - started)

    def drain(self) -> None:
        """New calls get UNAVAILABLE; those held are still answered."""
        if self.transport is not None:
            self.transport.drain()

    async def stop(self, grace_s: float) -> None:
        """Waits up to `grace_s` for the calls held to be answered, ends the rest with UNAVAILABLE and
        stops the transport."""
        if self.transport is None:
            return
        self.transport.drain()
        until = time.monotonic() + grace_s
        while self.transport.held and time.monotonic() < until:
            await asyncio.sleep(DRAIN_POLL_S)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.transport.stop, max(0.0, until - time.monotonic()))
        await loop.run_in_executor(None, self._thread.join)
        self.transport.free()
        self.transport = None
