"""The main port's methods through the native transport, on a port of their own (setting `native_port`) or
on the main port itself (`grpc_transport native`): gRPC's C++ server holds the calls, the event loop takes
them in groups when the transport's eventfd says some wait.

Plain `Embed` calls (inputs, model, normalize, truncate) take the group path: the core checks each call and
takes room for its inputs in the encoder's queue before tokenizing a group's texts at once
(service/core/embed_groups.py); Python's work per call is its request's parsing and its reply's building,
the rest is per group. Every other unary call (Embed with `options` or `token_ids`, the other bertserve.v1
methods, KServe v2, health Check) is answered one by one by the main port's own handler
(service/grpc/native/unary_calls.py). Streams (EmbedStream, health Watch, reflection) never reach Python
here: the transport relays them to this front's grpc.aio server (relay.h). All share queues, batches and
bounds with grpc.aio's calls. A call that ends in C++ after it was taken (its client left, its deadline
passed) is reported back with the status it ended with: its queued inputs are cancelled and it is counted
as its client saw it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable

import grpc

from bertserve.service import errors
from bertserve.service.core.embed_groups import Admitted, EmbedGroups, PlainEmbed
from bertserve.service.core.lifecycle import Lifecycle
from bertserve.service.core.results import EmbedResult
from bertserve.service.grpc import v1_messages as messages
from bertserve.service.grpc.admission import NEVER_REFUSED
from bertserve.service.grpc.native.transport import STATUS_CODES, NativeTransport, TakenCall
from bertserve.service.grpc.native.unary_calls import UnaryCall, answer, run
from bertserve.service.grpc.rpc_status import check_response_size, parse_request, status_message, status_of
from bertserve.service.memory import IdleRelease
from bertserve.service.settings import Settings
from bertserve.v1 import inference_pb2 as pb

log = logging.getLogger(__name__)

EMBED = "/bertserve.v1.Inference/Embed"  # method 0: plain calls take the group path
DRAIN_POLL_S = 0.01  # while draining: how often the calls still held are counted
INLINE_PARSE_BYTES = 64 * 1024  # larger requests are parsed on the CPU pool, not the event loop
COUNT_EVERY_S = 1.0  # how often the transport's own refusals reach the metrics
CODES = {code.value[0]: code for code in grpc.StatusCode}
# A group's calls are tokenized on the loop up to this many characters in all (a bounded hold of the loop,
# cheaper than the hop to the CPU pool); the rest of the group goes to the pool in one hop.
INLINE_GROUP_CHARS = 2048


class NativeFront:
    def __init__(
        self, core, settings: Settings, lifecycle: Lifecycle, handlers: dict[str, grpc.RpcMethodHandler]
    ):
        """`handlers`: the main port's unary handlers by full method name (unary_calls.HandlerTable)."""
        self.core, self.settings, self.lifecycle = core, settings, lifecycle
        others = [name for name in handlers if name != EMBED]
        # health checks last: the transport answers them beside full limits and while draining
        self.methods = [EMBED, *sorted(others, key=lambda name: name in NEVER_REFUSED)]
        self._probes = sum(name in NEVER_REFUSED for name in others)
        self._handlers = [handlers[name] for name in self.methods]
        self._rpcs = [name.rsplit("/", 1)[-1] for name in self.methods]
        # health checks go uncounted, as on the main port
        self._uncounted = frozenset(self._rpcs[len(self.methods) - self._probes :])
        self.metrics = core.metrics
        self.groups = EmbedGroups(core)
        self.transport: NativeTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[asyncio.Task] = set()  # calls being parsed or tokenized on the CPU pool
        self._counting: asyncio.Task | None = None
        self._counted = [[0] * STATUS_CODES for _ in self.methods]  # the transport's counts already added
        # calls taken and not yet answered -> what cancels them once queued or running (None before)
        self._live: dict[int, Callable[[], object] | None] = {}
        self._ended: dict[int, grpc.StatusCode] = {}  # live calls the transport ended: how
        self._stopping = False  # no call is taken once stop has begun
        self._idle = IdleRelease()  # the heap's free pages go back once no call is in flight

    async def start(
        self,
        host: str,
        port: int,
        tls: tuple[bytes, bytes, bytes] | None,
        reuse_port: bool = False,
        relay: str = "",
    ) -> int:
        """Listens (building the transport on first use) and takes calls as they come; returns the port.
        `reuse_port`: one front of several sharing the port (service/supervisor/ports.py); `relay`: the
        address of this front's grpc.aio server, which the streams are relayed to."""
        s = self.settings
        self._loop = asyncio.get_running_loop()
        self.transport = await self._loop.run_in_executor(
            None,
            lambda: NativeTransport(
                f"{host}:{port}", self.methods, s.max_queue_inputs, s.max_request_bytes_in_flight, s.max_message_bytes,
                s.concurrent_rpcs_limit(), s.http_read_timeout_s, tls, reuse_port, relay, self._probes,
            ),
        )  # fmt: skip
        self._loop.add_reader(self.transport.wakeup_fd, self._take)
        self._counting = asyncio.ensure_future(self._count_transport())
        return self.transport.port

    async def _count_transport(self) -> None:
        """The calls the transport ended before they were taken, added to bertserve_requests_total every
        COUNT_EVERY_S (and once more at stop)."""
        while True:
            await asyncio.sleep(COUNT_EVERY_S)
            self._add_transport_counts()

    def _add_transport_counts(self) -> None:
        counts = self.transport.counts()
        for rpc, method_now, method_before in zip(self._rpcs, counts, self._counted, strict=True):
            for code, (now, before) in enumerate(zip(method_now, method_before, strict=True)):
                if now > before and rpc not in self._uncounted:
                    self.metrics.requests.labels(rpc, CODES[code].name).inc(now - before)
        self._counted = counts

    def _take(self) -> None:
        """On the loop, when calls wait: one group (up to max_batch_size calls) per turn of the loop, parsed
        (large requests on the CPU pool), then admitted and tokenized (`_admit`). Calls left after a take
        (or drops) make the transport write the eventfd again: the next turn takes them, so a flood never
        holds the loop."""
        if self.transport is None or self._stopping:
            return
        with contextlib.suppress(BlockingIOError):
            os.read(self.transport.wakeup_fd, 8)
        limit = self.settings.max_batch_size
        calls = self.transport.take(limit)
        if calls is None:  # stopped
            return
        started = time.perf_counter()
        for call in calls:
            self.lifecycle.enter()  # left in `_answer` (or `_unary_done`)
            self._idle.begin()
            self._live[call.id] = None  # before the drops are read: one of these may be among them
        self._read_drops()
        for call in calls:
            if call.method != 0:  # any other unary method: its main-port handler answers it
                handler = self._handlers[call.method]
                self._unary(UnaryCall(call.id, self._rpcs[call.method], handler, call.request, call.deadline))
        calls = [call for call in calls if call.method == 0]
        if not calls:
            return
        small = [call for call in calls if len(call.request) <= INLINE_PARSE_BYTES]
        large = [call for call in calls if len(call.request) > INLINE_PARSE_BYTES]
        if small:
            self._admit([call.id for call in small], self._parsed(small), started)
        if large:  # parsed on the CPU pool (a bounded hold of the loop), then admitted here
            self._off_loop([call.id for call in large], lambda: self._parsed(large), self._admit, started)

    def _read_drops(self) -> None:
        """Every drop reported so far (cheap; at most one per call held)."""
        limit = self.settings.max_batch_size
        while True:
            dropped = self.transport.dropped(limit)
            self._drop(dropped)
            if len(dropped) < limit:
                break

    def _drop(self, dropped: list[tuple[int, int]]) -> None:
        """Calls whose client cancelled them (or whose deadline passed) after they were taken: their queued
        inputs are cancelled (the batcher skips them), and each is counted as the transport ended it."""
        for call, code in dropped:
            if call not in self._live:
                continue  # answered meanwhile
            self._ended[call] = CODES.get(code, grpc.StatusCode.CANCELLED)
            cancel = self._live[call]
            if cancel is not None:
                cancel()

    def _off_loop(self, ids: list[int], work, then, started: float, admitted: list[Admitted] = ()) -> None:
        """`then(ids, work(), started)` on the loop once `work` has run on the CPU pool; if that fails or is
        cancelled (the server stopping), the calls' room is given back and each call answered."""

        async def run() -> None:
            try:
                done = await self.core.off_loop(work)
            except BaseException as exc:
                for one in admitted:
                    one.permit.release()
                why = (
                    errors.ShuttingDown("the server is stopping")
                    if isinstance(exc, asyncio.CancelledError)
                    else exc
                )
                for call in ids:
                    self._answer(call, started, why)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            then(ids, done, started)

        task = asyncio.ensure_future(run())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _parsed(self, calls: list[TakenCall]) -> list[PlainEmbed | UnaryCall | BaseException]:
        out = []
        for call in calls:
            try:
                out.append(self._plain(call))
            except Exception as exc:  # a ServiceError refuses it; anything else is answered as INTERNAL
                out.append(exc)
        return out

    def _admit(
        self, ids: list[int], parsed: list[PlainEmbed | UnaryCall | BaseException], started: float
    ) -> None:
        """Each call checked and given room in its encoder's queue (or refused) before any tokenization;
        the calls then tokenized here up to INLINE_GROUP_CHARS characters in all (in arrival order, each
        call whole), the others on the CPU pool."""
        short: tuple[list[int], list[Admitted]] = ([], [])
        long: tuple[list[int], list[Admitted]] = ([], [])
        budget = INLINE_GROUP_CHARS
        for call, plain in zip(ids, parsed, strict=True):
            if isinstance(plain, UnaryCall):
                self._unary(plain)
                continue
            try:
                admitted = plain if isinstance(plain, BaseException) else self.groups.admit(plain)
            except Exception as exc:  # a ServiceError refuses it; anything else is answered as INTERNAL
                admitted = exc
            if isinstance(admitted, BaseException):
                self._answer(call, started, admitted)
                continue
            chars = sum(len(t) for t in admitted.texts)
            inline = chars <= budget
            budget -= chars if inline else 0
            group = short if inline else long
            group[0].append(call)
            group[1].append(admitted)
        if short[0]:
            self._submit(short[0], short[1], self._prepared(short[1]), started)
        if long[0]:
            calls, admitted = long
            self._off_loop(
                calls, lambda: self._prepared(admitted),
                lambda ids, prepared, at: self._submit(ids, admitted, prepared, at), started, admitted,
            )  # fmt: skip

    def _prepared(self, admitted: list[Admitted]) -> list[Admitted | BaseException]:
        try:
            return self.groups.prepare(admitted)
        except Exception as exc:  # answered, so no call hangs
            log.exception("native Embed: preparing calls failed")
            return [exc] * len(admitted)

    def _plain(self, call: TakenCall) -> PlainEmbed | UnaryCall:
        """A plain Embed call, or one with `options` or `token_ids` for the main port's handler."""
        request = parse_request(pb.EmbedRequest, call.request)
        if request.options.ByteSize() > 0 or request.token_ids:  # an empty `options` means every default
            return UnaryCall(call.id, self._rpcs[0], self._handlers[0], request, call.deadline)
        normalize = request.normalize if request.HasField("normalize") else None
        return PlainEmbed(request.model, list(request.inputs), normalize, request.truncate, call.deadline)

    def _unary(self, unary: UnaryCall) -> None:
        """On the loop: the call answered by its method's main-port handler, in a task of its own."""
        if unary.id in self._ended:  # its client left while it was parsed: nothing to run
            self._unary_done(unary, None)
            return
        task = run(unary, self._unary_done, self._ended.get)
        self._live[unary.id] = task.cancel  # a drop cancels it
        self._pending.add(task)

    def _unary_done(self, unary: UnaryCall, task: asyncio.Task | None) -> None:
        """The handler's reply or status handed to the transport (the handler counted the call, unless it
        never started); the call leaves the lifecycle. Never raises."""
        self._pending.discard(task)
        self._live.pop(unary.id, None)
        try:
            if self.transport is not None:
                ended = answer(self.transport, unary, task, self._ended.get(unary.id))
                if ended is not None and unary.rpc not in self._uncounted:  # its handler never counted it
                    self.metrics.requests.labels(unary.rpc, ended.name).inc()
        finally:
            self._ended.pop(unary.id, None)
            self.lifecycle.leave()
            self._idle.end()

    def _submit(
        self,
        ids: list[int],
        admitted: list[Admitted],
        prepared: list[Admitted | BaseException],
        started: float,
    ) -> None:
        """On the loop: each tokenized call's inputs queued in its room; a refused one's room given back."""
        for call, one, ready in zip(ids, admitted, prepared, strict=True):
            if call in self._ended:  # its client left while it was parsed or tokenized: nothing to compute
                ready = errors.ShuttingDown("the call ended before its inputs were queued")
            if isinstance(ready, BaseException):
                one.permit.release()
                self._answer(call, started, ready)
                continue
            try:
                cancel = self.groups.submit(
                    one, lambda result, call=call: self._answer(call, started, result)
                )
                if call in self._live:  # else answered at once (refused)
                    self._live[call] = cancel
            except Exception as exc:  # `submit` answers what it refuses; this is a bug's, answered too
                log.exception("native Embed: queueing a call failed")
                one.permit.release()
                self._answer(call, started, exc)

    def _answer(self, call: int, started: float, result: EmbedResult | BaseException) -> None:
        """On the loop: the call's reply (or status) handed to the transport; the call leaves the lifecycle.
        Never raises."""
        self._live.pop(call, None)
        try:
            if self.transport is None:  # stopped: the transport ended the call with UNAVAILABLE
                self._count(grpc.StatusCode.UNAVAILABLE, started)
            elif isinstance(result, EmbedResult):
                data = messages.embed(result)
                check_response_size(data, self.settings.max_message_bytes)
                sent = self.transport.reply(call, data)  # not: it had ended (its client left, a timeout)
                self._count(grpc.StatusCode.OK if sent else self._ended_as(call), started)
            elif isinstance(result, errors.ServiceError):
                self._fail(call, result, started)
            else:
                raise result
        except errors.ServiceError as exc:  # the reply is too large
            self._fail(call, exc, started)
        except Exception as exc:
            log.error("native Embed failed: %r", exc)
            with contextlib.suppress(Exception):
                self._fail(call, errors.InferenceFailed(f"internal error: {type(exc).__name__}"), started)
        finally:
            self._ended.pop(call, None)
            self.lifecycle.leave()
            self._idle.end()

    def _fail(self, call: int, exc: errors.ServiceError, started: float) -> None:
        code = status_of(exc)
        sent = self.transport.fail(call, code.value[0], status_message(str(exc)))
        self._count(code if sent else self._ended_as(call), started)

    def _ended_as(self, call: int) -> grpc.StatusCode:
        """How the transport ended `call` before its answer (a client that left: CANCELLED)."""
        return self._ended.get(call, grpc.StatusCode.CANCELLED)

    def _count(self, code: grpc.StatusCode, started: float) -> None:
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
        while self.transport.open_calls and time.monotonic() < until:  # held, or their request arriving
            await asyncio.sleep(DRAIN_POLL_S)
        self._stopping = True
        self._loop.remove_reader(self.transport.wakeup_fd)
        for task in list(self._pending):  # their calls answered with UNAVAILABLE, their room given back
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        await self._loop.run_in_executor(None, self.transport.stop, max(0.0, until - time.monotonic()))
        self._counting.cancel()
        self._add_transport_counts()
        self.transport.free()
        self.transport = None
