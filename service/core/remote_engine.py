"""A front's side of the engine process (`workers` > 1): `EngineLink` is the connection (a Unix socket,
service/engine/frame_link.py), and
`RemoteBatcher` takes the place of an encoder's `Batcher` in the front's core, sending each call's
tokenized inputs to the engine's batcher for that encoder in one message and ending the call on its answer.

Bounds: the engine admits against the one queue every front feeds (global `max_queue_inputs` and
`max_queue_attention`); each front also holds at most that many inputs of its own in flight (admitted,
being tokenized or waiting for the engine), so what a front holds is bounded before any work.
When the engine goes away, every call in flight fails with EngineUnavailable (UNAVAILABLE) at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from bertserve.service import errors
from bertserve.service.engine.batch_items import BatchLimits, ItemResult
from bertserve.service.engine.frame_link import FrameLink
from bertserve.service.engine.messages import inputs_out, lones_out, results_in, rows_in
from bertserve.service.engine.queue_room import LaneRoom, Permit
from bertserve.service.engine.unary_calls import CallInputs, OnEnd, ended, settle

log = logging.getLogger("bertserve.front")

Answer = Callable[[tuple | None, Exception | None], None]
CONNECT_RETRY_S = 0.05  # while the engine loads its models and does not listen yet


class EngineLink:
    """One front's connection to the engine. `on_lost` is called once if the engine goes away."""

    def __init__(self, address: str, on_lost: Callable[[], None] = lambda: None):
        self._address = address
        self._link: FrameLink | None = None
        self._calls: dict[int, Answer] = {}
        self._ids = itertools.count(1)
        self._hello: asyncio.Future | None = None
        self._on_lost = on_lost
        self._closing = False
        self.lost: Exception | None = None  # set once the engine went away
        self.encoders: dict[str, tuple[str, str]] = {}  # encoder -> (provider, device), from the hello

    async def connect(self, models: dict[str, int]) -> dict[str, tuple[str, str]]:
        """Waits until the engine answers (it listens once its models are warm); returns its encoders.
        StartupError when the engine serves other models than `models` (name -> version: this front's)."""
        loop = asyncio.get_running_loop()
        self._hello = loop.create_future()
        while True:  # the supervisor ends the server if the engine fails to start
            try:
                _, self._link = await loop.create_unix_connection(
                    lambda: FrameLink(self._received, self._closed), self._address
                )
                break
            except (FileNotFoundError, ConnectionRefusedError):
                await asyncio.sleep(CONNECT_RETRY_S)
        self._link.post(("hello",))
        self.encoders, engine_models = await self._hello
        if engine_models != models:
            raise errors.StartupError(
                f"the engine serves {engine_models}, this front loaded {models} (the repository changed "
                "since the engine started: restart the server)"
            )
        return self.encoders

    def call(self, message: tuple, answer: Answer) -> int:
        """Sends `message` (its second field is filled with a new call id); `answer(results, error)` is
        called once, unless the call is cancelled first."""
        if self.lost is not None:
            raise self.lost
        if self._link is None or not self._hello.done():  # the front listens before the engine does
            raise errors.EngineUnavailable("the engine is still loading its models; retry")
        call = next(self._ids)
        self._calls[call] = answer
        self._link.post((message[0], call, *message[1:]))
        return call

    def call_lone(self, fields: tuple, answer: Answer) -> int:
        """As `call`, for a unary call of one input and one option: `fields` (encoder, model, options, ids,
        type ids, mask positions or None, deadline) join this turn's `lones` message."""
        if self.lost is not None:
            raise self.lost
        if self._link is None or not self._hello.done():
            raise errors.EngineUnavailable("the engine is still loading its models; retry")
        call = next(self._ids)
        self._calls[call] = answer
        self._link.gather(lones_out, (call, *fields), self._lones_failed)
        return call

    def _lones_failed(self, calls: list, error: Exception) -> None:
        """The turn's `lones` could not be built: its calls fail here (none of them reached the engine)."""
        for call, *_ in calls:
            answer = self._calls.pop(call, None)
            if answer is not None:
                answer(None, errors.InferenceFailed(f"the call could not be sent to the engine: {error}"))

    def cancel(self, call: int, then: Callable[[], None]) -> None:
        """Asks the engine to drop `call`; `then()` runs once the engine has answered it in any way (or is
        gone), so what the call holds is freed only when the engine no longer holds its inputs."""
        if call in self._calls:
            self._calls[call] = lambda results, error: then()
            self._link.post(("cancel", call))

    def close(self) -> None:
        """Closes the connection; calls still waiting fail with ShuttingDown (the engine is not lost)."""
        self._closing = True
        calls, self._calls = self._calls, {}
        for answer in calls.values():
            answer(None, errors.ShuttingDown("the front is closing its link to the engine"))
        if self._link is not None:
            self._link.close()

    def _received(self, _link: FrameLink, message: tuple) -> None:
        kind = message[0]
        if kind == "hello":
            if self._hello is not None and not self._hello.done():
                self._hello.set_result(message[1:])
            return
        if kind == "rows":  # single-input calls: each answered as a `done` of one result
            for call, result in rows_in(message):
                answer = self._calls.pop(call, None)
                if answer is not None:
                    answer(result, None)
            return
        answer = self._calls.pop(message[1], None)
        if answer is None:
            return
        if kind == "done":
            answer(message[2], None)
        elif kind == "cancelled":
            answer(None, errors.ShuttingDown("cancelled"))  # only a cancelled call's `then` hears it
        else:
            kind_of_error = getattr(errors, message[2], errors.InferenceFailed)
            answer(None, kind_of_error(message[3]))

    def _closed(self, exc: Exception | None) -> None:
        """The connection ended: no call is left waiting for an answer that cannot come."""
        if self._closing:
            return
        if exc is not None:
            log.error("the link to the engine failed: %r", exc)
        self._lose(errors.EngineUnavailable("the engine process is gone; the server is restarting"))

    def _lose(self, error: Exception) -> None:
        if self.lost is not None:
            return
        self.lost = error
        calls, self._calls = self._calls, {}
        for answer in calls.values():
            answer(None, error)
        if self._hello is not None and not self._hello.done():
            self._hello.set_exception(error)
        log.error("%s", error)
        self._on_lost()


class RemoteBatcher:
    """What the core calls an encoder's batcher in a front: admission per front, batching in the engine."""

    def __init__(self, link: EngineLink, name: str, limits: BatchLimits):
        self.name = name
        self.limits = limits
        self._link = link
        self._room = {bulk: LaneRoom(limits.max_queue_inputs) for bulk in (False, True)}
        self._exclusive = LaneRoom(limits.max_queue_exclusive)
        self._closing = False

    def start(self) -> None: ...

    @property
    def running(self) -> bool:
        return not self._closing

    async def close(self) -> None:
        """Refuses new calls; those in flight finish in the engine (the drain waits for them)."""
        self._closing = True
        for room in (*self._room.values(), self._exclusive):
            room.fail_waiting(errors.ShuttingDown(f"model {self.name}: the server is shutting down"))

    async def abort(self) -> None:
        await self.close()

    def _check(self) -> None:
        if self._closing:
            raise errors.ShuttingDown(f"model {self.name}: the server is shutting down")
        if self._link.lost is not None:
            raise self._link.lost

    def reserve(self, n: int, bulk: bool = False, deadline: float | None = None) -> Permit:
        self._check()
        room = self._room[bulk]
        if not room.fits(n):
            kind = "stream" if bulk else "unary"
            raise errors.Overloaded(
                f"model {self.name}: this front holds {room.used} of max_queue_inputs "
                f"{self.limits.max_queue_inputs} {kind} inputs in flight; this call adds {n}; retry later"
            )
        return room.take(n)

    async def wait_room(self, n: int, bulk: bool = True) -> Permit:
        self._check()
        if n > self.limits.max_queue_inputs:
            raise errors.Overloaded(
                f"model {self.name}: {n} inputs is more than max_queue_inputs "
                f"{self.limits.max_queue_inputs}; send fewer inputs per request"
            )
        return await self._room[bulk].wait(n)

    def reserve_exclusive(self) -> Permit:
        self._check()
        if not self._exclusive.fits(1):
            raise errors.Overloaded(
                f"model {self.name}: {self._exclusive.used} attention calls of this front are in flight, "
                f"max_queue_attention {self.limits.max_queue_exclusive}; retry later"
            )
        return self._exclusive.take(1)

    def submit_call(self, inputs: CallInputs, on_end: OnEnd, permit: Permit) -> RemoteCall:
        """Sends the call's inputs to the engine in one message; `on_end` runs once, as for
        `Batcher.submit_call`. The permit's room is held until the engine's answer (or a cancellation)."""
        self._check()
        if len(inputs.ids) == 1 and len(inputs.options) == 1 and not inputs.bulk:
            mask = None if inputs.masks is None else inputs.masks[0]
            fields = (
                self.name,
                inputs.model.name,
                inputs.options[0],
                inputs.ids[0],
                inputs.type_ids[0],
                mask,
            )
            return self._send(self._link.call_lone, (*fields, inputs.deadline), on_end, permit)
        fields = (inputs.model.name, inputs.options, inputs.ids, inputs.type_ids, inputs.masks)
        message = ("submit", self.name, inputs.bulk, inputs.deadline, inputs_out(*fields))
        return self._send(self._link.call, message, on_end, permit)

    async def submit_exclusive(self, run, tokens: int, deadline: float | None, permit: Permit) -> ItemResult:
        """`run` (an AttentionRun) is sent as its fields; the engine runs its own graph."""
        future = asyncio.get_running_loop().create_future()
        message = ("attention", self.name, run.model, run.ids, run.type_ids, run.layers, run.heads, deadline)
        try:
            self._check()
            remote = self._send(self._link.call, message, settle(future), permit)
        except BaseException:
            permit.release()  # the core hands the room over with the job
            raise
        try:
            (result,) = await future
            return result
        finally:
            remote.cancel()

    def _send(
        self, call: Callable[[tuple, Answer], int], message: tuple, on_end: OnEnd, permit: Permit
    ) -> RemoteCall:
        """`call(message, answer)` (the link's `call` or `call_lone`) sends it, as a `RemoteCall`.
        The room is freed when the engine no longer holds the call's inputs (its answer, or its word that
        it dropped a cancelled call), by this permit of its own: the core's release of `permit`, as its
        call ends, frees nothing once the call is sent."""
        remote = RemoteCall(self._link, on_end, Permit(permit.room, permit.inputs))
        remote.id = call(message, remote.answer)
        permit.hand_over()
        return remote


class RemoteCall:
    """A call sent to the engine. `on_end` runs once: (its results, None), (None, its error), or (None, None)
    once cancelled; `held` (its room) is released when the engine has answered it in any way."""

    __slots__ = ("id", "ended", "_link", "_on_end", "_held")

    def __init__(self, link: EngineLink, on_end: OnEnd, held: Permit):
        self.id = 0
        self.ended = False
        self._link, self._on_end, self._held = link, on_end, held

    def answer(self, results: tuple | None, error: Exception | None) -> None:
        """The link's answer (once): `results_out`'s results, or the error."""
        self._held.release()
        if not self.ended:
            self.ended = True
            try:
                results = None if results is None else results_in(results)
            except Exception as exc:  # never raised into the link's loop over a frame
                results, error = None, errors.InferenceFailed(f"the engine's answer could not be read: {exc}")
            ended(self._on_end, results, error)

    def cancel(self) -> None:
        """The caller went away (nothing once ended): ended at once; the engine drops its inputs."""
        if not self.ended:
            self.ended = True
            try:
                self._link.cancel(self.id, self._held.release)
            finally:
                ended(self._on_end, None, None)
