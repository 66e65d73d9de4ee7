"""The engine process (`bertserve serve --workers N`, N > 1): owns the ONNX Runtime sessions and one batcher
per encoder; the fronts send it tokenized inputs over a Unix socket (service/engine/frame_link.py) and get each
call's results back. Inputs from every front it serves share the same queue, so they share batches.

Admission of batch inputs (`max_queue_inputs`, deadlines) and of Attention calls (`max_queue_attention`)
happens here, against the one queue its fronts feed: the bounds are per engine (`engines` of them). A front
that goes away leaves its calls to finish; their answers are dropped (posted to a closed connection).
With several engines, each listens only once every one is warm (a barrier), so no front reports serving
while another still waits for its engine.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from bertserve.service import errors
from bertserve.service.engine import model_registry
from bertserve.service.engine.batch_items import WorkItem
from bertserve.service.engine.encoders import EncoderGroup, attach_batchers
from bertserve.service.engine.frame_link import FrameLink
from bertserve.service.engine.lone_calls import ANSWERED, LoneCall
from bertserve.service.engine.messages import error_out, inputs_in, lones_in, results_out
from bertserve.service.engine.model_registry import ModelRegistry
from bertserve.service.engine.tasks import Task
from bertserve.service.engine.unary_calls import UnaryCall, settle, submit_call
from bertserve.service.metrics import Metrics
from bertserve.service.settings import Settings
from bertserve.service.thread_names import name_this_thread, naming

log = logging.getLogger("bertserve.engine")


class Engine:
    """Loads the models, warms them up, then answers fronts on `address` until `stop`."""

    def __init__(
        self,
        settings: Settings,
        address: str,
        metrics: Metrics | None = None,
        all_warm: threading.Barrier | None = None,
    ):
        """`metrics`: by default those of a child of the supervisor, which serves one scrape of them all.
        `all_warm`: the engines' barrier (several engines), passed once this one is warm."""
        self.settings = settings
        self.address = address
        self._all_warm = all_warm
        self._passed = False  # the barrier passed (an abort after that would break the others' wait)
        self.metrics = metrics or Metrics(multiprocess=True)
        self.metrics.export_limits(settings)
        self.registry: ModelRegistry | None = None
        self._groups: dict[str, EncoderGroup] = {}  # by encoder name, once loaded
        self._calls: dict[
            tuple[FrameLink, int], asyncio.Task | UnaryCall | LoneCall | None
        ] = {}  # (front, call)
        self._cpu = ThreadPoolExecutor(1, "bertserve-engine-load", naming("bs-engine-load"))
        self._server: asyncio.AbstractServer | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        # the fronts tokenize; the engine's tokenizers only warm its graphs up (tokens and offsets: the library)
        settings = self.settings.model_copy(update={"native_tokenizer": False})
        self.registry = await loop.run_in_executor(self._cpu, model_registry.load, settings)
        self._groups = {group.name: group for group in self.registry.encoders}  # looked up per call
        # no batch cut ahead but a full one: the next batch is cut as soon as an instance is free, with every
        # input that came while the last one computed; one that cannot grow waits for the instance instead,
        # so the device never waits for this loop, busy with the fronts' frames under load
        attach_batchers(self.registry, self.settings, self.metrics, prefetch=0, ahead_when_full=True)
        for group in self.registry.encoders:
            group.batcher.start()
            await loop.run_in_executor(group.executor, group.warm_up)
        if self._all_warm is not None:
            log.info("engine warm in %.1fs; waiting for the other engines", time.perf_counter() - started)
            try:
                await loop.run_in_executor(self._cpu, self._pass_barrier)
            except threading.BrokenBarrierError:
                # an engine stopped or failed before all were warm: the supervisor stops every process, so
                # this one waits for that stop without serving (serve() returns once it comes)
                log.info("another engine stopped before serving: this one waits to be stopped")
                return
        # fronts connect only now (they retry until the socket is there): a hello answered means ready. What
        # a front has in flight is bounded by its own admission (service/core/remote_engine.py); answers it
        # has not read yet wait in its connection's transport, never dropped.
        self._server = await loop.create_unix_server(
            lambda: FrameLink(self._handle, lambda exc: None), self.address
        )
        log.info("engine ready in %.1fs", time.perf_counter() - started)

    def _pass_barrier(self) -> None:
        self._all_warm.wait()
        self._passed = True

    def stop(self) -> None:
        self._stopping.set()
        self.leave_barrier()

    def leave_barrier(self) -> None:
        """Before passing the barrier (stopped, or failed to start): the other engines stop waiting."""
        if self._all_warm is not None and not self._passed:
            self._all_warm.abort()

    async def serve(self) -> None:
        await self._stopping.wait()
        # the fronts have drained (the supervisor stops the engine last): finish what is queued
        for group in self.registry.encoders:
            await group.batcher.close()
        if self._server is not None:
            self._server.close()
        for group in self.registry.encoders:
            group.executor.shutdown(wait=False, cancel_futures=True)

    def _handle(self, front: FrameLink, message: tuple) -> None:
        try:
            self._dispatch(front, message)
        except Exception as exc:
            log.exception("engine: a message from a front failed")
            if message and message[0] in ("submit", "attention"):  # answered, so the call never hangs
                self._calls.pop((front, message[1]), None)
                self._send(front, error_out(message[1], exc))

    def _dispatch(self, front: FrameLink, message: tuple) -> None:
        kind = message[0]
        if kind == "hello":
            encoders = {g.name: (g.provider, g.session.device) for g in self.registry.encoders}
            models = {m.name: m.version for m in self.registry.ordered}
            self._send(front, ("hello", encoders, models))
        elif kind == "cancel":
            task = self._calls.get((front, message[1]))
            if task is not None:
                task.cancel()
        elif kind == "lones":
            self._submit_lones(front, message)
        elif kind == "submit" and not message[3]:  # a unary call: admitted or refused at once, no task
            self._submit_now(front, *message[1:])
        else:  # a stream's request (it waits for room) or an attention call
            call = message[1]
            coro = (
                self._submit_bulk(front, *message[2:]) if kind == "submit" else self._attention(*message[2:])
            )
            task = asyncio.ensure_future(coro)
            self._calls[(front, call)] = task
            task.add_done_callback(lambda done: self._answer(front, call, done))

    def _submit_lones(self, front: FrameLink, message: tuple) -> None:
        """A turn's single-input unary calls from `front`, each admitted or refused on its own."""
        models, calls, read = self.registry.by_name, self._calls, 0
        try:
            for call, encoder, model, options, ids, type_ids, mask, deadline in lones_in(message):
                read += 1
                key = (front, call)
                mask = mask if options.task is Task.FILL_MASK else None
                try:
                    batcher = self._groups[encoder].batcher
                    lone = LoneCall(calls, front, call, batcher)
                    item = WorkItem(ids, type_ids, options, lone, deadline, mask, models[model], False, front)
                    calls[key] = lone
                    batcher.submit([item])
                except Exception as exc:  # refused (a ServiceError), or a bug: answered, the others go on
                    if not isinstance(exc, errors.ServiceError):
                        log.exception("engine: a call from a front failed")
                    calls.pop(key, None)
                    front.post(error_out(call, exc))
        except Exception as exc:  # the message itself unreadable: its calls not yet read are answered
            log.exception("engine: a front's lones message failed")
            for call in message[1][read:]:
                front.post(error_out(call, exc))

    def _submit_now(
        self, front: FrameLink, call: int, encoder: str, bulk: bool, deadline: float | None, inputs: tuple
    ) -> None:
        """A unary call's inputs queued now (or its refusal sent); answered when the last result is in."""
        batcher, key = self._group(encoder).batcher, (front, call)

        def end(results: list | None, error: BaseException | None) -> None:
            if self._calls.pop(key, ANSWERED) is ANSWERED:
                return  # answered already (a failure in `_handle`)
            try:  # runs inside the batcher's loops over a batch: it must not raise into them
                if error is not None:
                    self._send(front, error_out(call, error))
                elif results is None:
                    self._send(front, ("cancelled", call))  # the front frees the call's room on this
                else:
                    self._send(front, ("done", call, results_out(results)))
            except Exception as exc:
                log.exception("engine: answering call %d failed", call)
                self._send(front, error_out(call, exc))

        self._calls[key] = None  # before the submit: a call may end within it (no rows)
        try:  # room and deadline checked once, taken at once
            unary = submit_call(
                batcher, inputs_in(inputs, self.registry.by_name, deadline, bulk), end, origin=front
            )
        except errors.ServiceError as exc:
            self._calls.pop(key, None)
            self._send(front, error_out(call, exc))
            return
        if key in self._calls:
            self._calls[key] = unary

    def _answer(self, front: FrameLink, call: int, task: asyncio.Task) -> None:
        self._calls.pop((front, call), None)
        if task.cancelled():
            self._send(front, ("cancelled", call))  # the front frees the call's room on this
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, errors.ServiceError):
            log.error("engine: call failed: %r", exc)
        self._send(front, ("done", call, task.result()) if exc is None else error_out(call, exc))

    def _send(self, front: FrameLink, message: tuple) -> None:
        front.post(message)  # nothing once the front has gone away

    def _group(self, name: str) -> EncoderGroup:
        return self._groups[name]

    async def _submit_bulk(
        self, front: FrameLink, encoder: str, bulk: bool, deadline: float | None, inputs: tuple
    ) -> tuple:
        """A stream's request: it waits for room in the streams' lane, as in one process."""
        batcher = self._group(encoder).batcher
        call_inputs = inputs_in(inputs, self.registry.by_name, deadline, bulk)
        future = asyncio.get_running_loop().create_future()
        permit = await batcher.wait_room(call_inputs.rows, True)
        try:
            unary = submit_call(batcher, call_inputs, settle(future), permit, front)
        finally:
            permit.release()
        try:
            return results_out(await future)
        finally:
            unary.cancel()  # after a failure or a cancel

    async def _attention(
        self, encoder: str, model: str, ids, type_ids, layers: list[int], heads: list[int], deadline
    ) -> list:
        served = self.registry.by_name[model]
        batcher = self._group(encoder).batcher
        run = served.attention.bind(ids, type_ids, layers, heads, served.name)
        return results_out([await batcher.submit_exclusive(run, int(ids.shape[0]), deadline)])


async def _run(settings: Settings, address: str, all_warm: threading.Barrier | None) -> int:
    engine = Engine(settings, address, all_warm=all_warm)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, engine.stop)  # the supervisor's, once the fronts have drained
    try:
        await engine.start()
    except BaseException as exc:
        engine.leave_barrier()  # failed to start: no other engine waits for this one
        if not isinstance(exc, errors.StartupError):
            raise
        log.error("cannot start: %s", exc)
        return 1
    await engine.serve()
    return 0


def main(settings: Settings, address: str, all_warm: threading.Barrier | None = None) -> int:
    """The engine process's entry (spawned by the supervisor); `all_warm`: the engines' barrier, if several."""
    name_this_thread("bs-engine")  # its loop: the fronts' frames, admission, batching
    return asyncio.run(_run(settings, address, all_warm))
