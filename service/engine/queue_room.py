"""Room in a batcher's queue lane, taken BEFORE a call's work (as TEI takes a permit before it tokenizes).

A lane holds at most `limit` inputs: those queued plus those whose call holds a `Permit` (admitted, being
tokenized). A unary call takes its room at once or is refused (`LaneRoom.take` raises nothing itself: the
batcher checks `fits` first and names the limit); a stream's request waits for room in arrival order
(`LaneRoom.wait`), so a full queue slows streams down instead of refusing requests they already sent.
Room comes back when the inputs leave the queue (cut into a batch or dropped) or the permit is released
unused (the call failed before it was queued).
"""

from __future__ import annotations

import asyncio
from collections import deque


class Permit:
    """Room for `inputs` inputs in one lane. `Batcher.submit` turns it into queued inputs; `release`
    gives back room that was never used (safe to call more than once, and after submit)."""

    __slots__ = ("room", "inputs", "held")

    def __init__(self, room: LaneRoom, inputs: int):
        self.room, self.inputs, self.held = room, inputs, True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.room.free(self.inputs)

    def hand_over(self) -> None:
        """The inputs are queued now: their room is freed when they leave the queue."""
        self.held = False


class LaneRoom:
    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0  # inputs queued + inputs held by permits
        self._waiting: deque[tuple[int, asyncio.Future]] = deque()

    def fits(self, inputs: int) -> bool:
        """Room now, and no earlier caller waiting for it (they go first)."""
        return not self._waiting and self.used + inputs <= self.limit

    def take(self, inputs: int) -> Permit:
        self.used += inputs
        return Permit(self, inputs)

    async def wait(self, inputs: int) -> Permit:
        """Waits, in arrival order, until `inputs` fit (`inputs` must be at most `limit`)."""
        if self.fits(inputs):
            return self.take(inputs)
        granted = asyncio.get_running_loop().create_future()
        entry = (inputs, granted)
        self._waiting.append(entry)
        try:
            return await granted
        except BaseException:
            if granted.done() and not granted.cancelled() and granted.exception() is None:
                granted.result().release()  # granted as the caller was cancelled: give it back
            elif entry in self._waiting:
                self._waiting.remove(entry)
                self._grant()  # a large request at the head may have held smaller ones back
            raise

    def free(self, inputs: int) -> None:
        self.used -= inputs
        self._grant()

    def fail_waiting(self, error: Exception) -> None:
        while self._waiting:
            _, granted = self._waiting.popleft()
            if not granted.done():
                granted.set_exception(error)

    def _grant(self) -> None:
        while self._waiting and self.used + self._waiting[0][0] <= self.limit:
            inputs, granted = self._waiting.popleft()
            if not granted.done():  # a cancelled waiter is skipped
                granted.set_result(self.take(inputs))
