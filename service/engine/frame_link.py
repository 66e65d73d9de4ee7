"""One connection between a front and the engine: an asyncio Unix-socket protocol carrying `messages.pack`'s
frames, with no thread of its own (ZeroMQ's I/O threads cost every message two more wake-ups).

Both sides post many small messages (one per call and per answer). Each turn of the event loop, what was
posted leaves as one frame (the list of messages), and every complete frame that arrived is read in one
go. A frame is [u64 pickle bytes + buffer bytes][u32 buffers][u64 each buffer's bytes][pickle][buffers].
Small frames are read into one reused buffer; a frame with out-of-band buffers (large arrays) or larger
than that buffer is read straight into memory of its own, which its arrays then view (no copy but the
socket's). Nothing is dropped: what the peer has not read waits in the sender's transport.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable

from bertserve.service.engine.messages import pack, unpack

_HEAD = struct.Struct("<QI")  # the pickle's and buffers' bytes, the number of buffers
_LENGTH = struct.Struct("<Q")
READ_BUFFER_BYTES = 1 << 18  # frames up to this size share one buffer
Failed = Callable[[list, Exception], None]  # a gathered message's items, when building it raised
log = logging.getLogger("bertserve.link")


class FrameLink(asyncio.BufferedProtocol):
    """`on_message(link, message)` for each message, in order; `on_lost(exc)` once the connection ends."""

    def __init__(
        self, on_message: Callable[[FrameLink, object], None], on_lost: Callable[[Exception | None], None]
    ):
        self._on_message, self._on_lost = on_message, on_lost
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray(READ_BUFFER_BYTES)
        self._start = self._end = 0  # unread bytes: self._buffer[_start:_end]
        self._own: bytearray | None = None  # a frame read into memory of its own
        self._own_filled = 0
        self._outbox: list = []
        self._gathered: dict[Callable[[list], object], tuple[Failed, list]] = {}  # build -> (failed, items)
        self.closed = False

    # ---- sending
    def post(self, message: object) -> None:
        """Queues `message`; sent with the others posted this turn (dropped once the connection is gone)."""
        if self.closed:
            return
        if not self._outbox and not self._gathered:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(message)

    def gather(self, build: Callable[[list], object], item: object, failed: Failed) -> None:
        """Queues `item`: this turn's items of one `build` leave as the one message `build(items)`, before
        the messages posted this turn (a call's cancel after the call). Should `build` raise, or its message
        not pickle, `failed(items, error)` answers them instead (it should not raise: one that does is
        logged). Dropped once the connection is gone."""
        if self.closed:
            return
        if not self._outbox and not self._gathered:
            asyncio.get_running_loop().call_soon(self._flush)
        gathered = self._gathered.get(build)
        if gathered is None:
            self._gathered[build] = (failed, [item])
        else:
            gathered[1].append(item)

    def _flush(self) -> None:
        posted, self._outbox = self._outbox, []
        gathered, self._gathered = self._gathered, {}
        if self.closed or self._transport is None or self._transport.is_closing():
            return
        messages, built = [], []
        for build, (failed, items) in gathered.items():
            try:
                messages.append(build(items))
                built.append((failed, items))
            except Exception as exc:  # never the frame's other messages, nor the link, lost with it
                _failed(failed, items, exc)
        try:
            head, *buffers = pack(messages + posted)
        except Exception:  # a gathered message that does not pickle: its items failed, the rest sent
            head, *buffers = pack([*_picklable(messages, built), *posted])
        sizes = [memoryview(b).nbytes for b in buffers]
        total = len(head) + sum(sizes)
        lengths = b"".join(_LENGTH.pack(size) for size in sizes)
        self._transport.write(_HEAD.pack(total, len(buffers)) + lengths + head)
        for buffer in buffers:  # written as they are (posted arrays must not change after `post`)
            self._transport.write(buffer)

    # ---- the connection
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._outbox, self._gathered = [], {}
        self._on_lost(exc)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def pause_reading(self) -> None:
        """Reads nothing until `resume_reading` (what comes waits in the socket, then in the peer)."""
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    # ---- receiving
    def get_buffer(self, sizehint: int) -> memoryview:
        if self._own is not None:
            return memoryview(self._own)[self._own_filled :]
        if self._end == len(self._buffer):  # keep the unread part, at the start
            unread = self._end - self._start
            self._buffer[:unread] = self._buffer[self._start : self._end]
            self._start, self._end = 0, unread
        return memoryview(self._buffer)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._own is not None:
            self._own_filled += nbytes
            if self._own_filled == len(self._own):
                frame, self._own = self._own, None
                self._deliver(memoryview(frame), 0)
            return
        self._end += nbytes
        while self._own is None:
            if self._start == self._end:
                self._start = self._end = 0  # all read: the next frame starts at the front
            head = self._frame_head()
            if head is None:
                return
            size, buffers = head
            available = self._end - self._start
            if not buffers and size <= len(self._buffer):
                if available < size:
                    return  # the rest comes into the shared buffer
                self._deliver(memoryview(self._buffer), self._start)  # unpickled into objects of their own
                self._start += size
                continue
            self._own = bytearray(size)  # large, or viewed by its arrays: memory of its own
            take = min(available, size)
            self._own[:take] = self._buffer[self._start : self._start + take]
            self._own_filled = take
            self._start += take
            if take == size:
                frame, self._own = self._own, None
                self._deliver(memoryview(frame), 0)

    def _frame_head(self) -> tuple[int, int] | None:
        """(the size of the frame at `_start`, its out-of-band buffers), once its head has arrived."""
        if self._end - self._start < _HEAD.size:
            return None
        total, buffers = _HEAD.unpack_from(self._buffer, self._start)
        return _HEAD.size + _LENGTH.size * buffers + total, buffers

    def _deliver(self, view: memoryview, at: int) -> None:
        for message in unpack(frame_parts(view, at)[0]):
            self._on_message(self, message)


def _picklable(messages: list, built: list) -> list:
    """The gathered `messages` that pickle; each other one's items failed."""
    kept = []
    for message, (failed, items) in zip(messages, built, strict=True):
        try:
            pack(message)
            kept.append(message)
        except Exception as exc:
            _failed(failed, items, exc)
    return kept


def _failed(failed: Failed, items: list, error: Exception) -> None:
    log.error("a gathered message of %d items could not be sent", len(items), exc_info=error)
    try:
        failed(items, error)
    except Exception:
        log.exception("answering the items of a message that could not be sent failed")


def frame_parts(view: memoryview | bytes, at: int) -> tuple[list, int]:
    """The parts of the complete frame at `at` in `view` (the pickle, then each buffer, as `unpack` takes
    them) and where the frame ends."""
    total, count = _HEAD.unpack_from(view, at)
    at += _HEAD.size
    sizes = [_LENGTH.unpack_from(view, at + _LENGTH.size * k)[0] for k in range(count)]
    at += _LENGTH.size * count
    parts = []
    for size in [total - sum(sizes), *sizes]:
        parts.append(view[at : at + size])
        at += size
    return parts, at
