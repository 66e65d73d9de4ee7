"""A front's call of one input and one option, as the engine holds it: most calls under load.

`LoneCall` is its one `WorkItem`'s future (the part of asyncio.Future's interface the batcher uses) and
answers its front itself: its result joins the turn's `rows` message (messages.rows_out), its error or
cancel goes as its own message. It stands in for a `CallInputs`, a `UnaryCall` with its slot and a
callback per call, which cost the engine's loop more per call than the rest of the call's path.
"""

from __future__ import annotations

from typing import Any

from bertserve.service.engine.batch_items import ItemResult
from bertserve.service.engine.frame_link import FrameLink
from bertserve.service.engine.messages import error_out, rows_out

ANSWERED = object()  # a call no longer in the engine's table of calls


class LoneCall:
    """Answered once, to `front`, and taken out of `calls` (the engine's, keyed (front, call)) as it is; a
    call already taken out (a failure in the engine's handling answered it) is not answered again."""

    __slots__ = ("ended", "_calls", "_front", "_call", "_batcher")

    def __init__(self, calls: dict, front: FrameLink, call: int, batcher: Any):
        self.ended = False
        self._calls, self._front, self._call, self._batcher = calls, front, call, batcher

    def done(self) -> bool:
        return self.ended

    def set_result(self, result: ItemResult) -> None:
        if self._end():
            self._front.gather(rows_out, (self._call, result), self._rows_failed)

    def set_exception(self, error: BaseException) -> None:
        if self._end():
            self._front.post(error_out(self._call, error))

    def cancel(self) -> None:
        """The front's cancel: its input is skipped if still queued; the front frees its room on the answer."""
        if self._end():
            self._batcher.note_dead()
            self._front.post(("cancelled", self._call))

    def _rows_failed(self, rows: list, error: Exception) -> None:
        """The turn's `rows` could not be built: each of its calls answered with the error."""
        for call, _ in rows:
            self._front.post(error_out(call, error))

    def _end(self) -> bool:
        if self.ended:
            return False
        self.ended = True
        return self._calls.pop((self._front, self._call), ANSWERED) is not ANSWERED
