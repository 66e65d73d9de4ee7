"""A unary call's inputs as the engine process queues them: one result slot per input, and the call ended once
(all results in, the first error, or the front's cancel) by a plain callback.

The slots stand in for asyncio futures where the batcher holds them (`WorkItem.future`): it asks `done()` (on
the event loop, and from the worker thread before a batch computes), `set_result` and `set_exception` (on the
loop). A future per input cost the engine's loop a future, a done-callback and a turn of the loop per result.
"""

from __future__ import annotations

from collections.abc import Callable

_PENDING = object()


class UnaryCall:
    """`on_end(results, error)` runs once: (every input's result in order, None), (None, the first error),
    or (None, None) when cancelled. Results that come after the end are dropped."""

    __slots__ = ("results", "waiting", "ended", "_on_end")

    def __init__(self, inputs: int, on_end: Callable[[list | None, BaseException | None], None]):
        self.results: list = [_PENDING] * inputs
        self.waiting = inputs
        self.ended = False
        self._on_end = on_end

    def slots(self) -> list[ResultSlot]:
        """One per input, in order (not kept here: the call and its slots form no cycle for the collector)."""
        return [ResultSlot(self, i) for i in range(len(self.results))]

    def cancel(self) -> None:
        """The front's cancel: the queued inputs are skipped (their slots read done)."""
        self._end(None, None)

    def _end(self, results: list | None, error: BaseException | None) -> None:
        if not self.ended:
            self.ended = True
            self._on_end(results, error)

    def _set(self, index: int, value: object) -> None:
        if self.ended or self.results[index] is not _PENDING:
            return
        self.results[index] = value
        self.waiting -= 1
        if not self.waiting:
            self._end(self.results, None)


class ResultSlot:
    """One input's place in its `UnaryCall`, with the part of asyncio.Future's interface the batcher uses."""

    __slots__ = ("call", "index")

    def __init__(self, call: UnaryCall, index: int):
        self.call, self.index = call, index

    def done(self) -> bool:
        """Its result is in, or the call has ended (answered, failed or cancelled)."""
        return self.call.ended or self.call.results[self.index] is not _PENDING

    def set_result(self, value: object) -> None:
        self.call._set(self.index, value)

    def set_exception(self, error: BaseException) -> None:
        """Ends the whole call with `error` (the front answers it with that error)."""
        self.call._end(None, error)
