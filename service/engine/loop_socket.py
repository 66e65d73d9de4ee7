"""A ZeroMQ socket on the asyncio event loop, for the fronts' link to the engine and the engine's socket.

Both sides post many small messages (one per call and per answer). Each turn of the event loop, what was
posted for one peer leaves as one ZeroMQ message (`messages.pack` of the list), and the reader takes every
message already waiting without a future per message (zmq.asyncio makes one per recv): the cost per call
of the hop falls with the load instead of staying fixed.

ZeroMQ's file descriptor is edge-triggered and a send may consume its edge, so after each send the reader
runs once more in the next turn (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq

from bertserve.service.engine.messages import pack, unpack

MESSAGES_PER_TURN = 256  # ZeroMQ messages read before the event loop runs anything else


class LoopSocket:
    """`socket` read on the running loop: `on_message(peer, message)` for each message of each ZeroMQ
    message (`peer` the routing id on a ROUTER, else None); `on_error(exc)` once if the socket fails."""

    def __init__(
        self,
        socket: zmq.Socket,
        on_message: Callable[[bytes | None, object], None],
        on_error: Callable[[BaseException], None],
        routed: bool = False,
        raw: bool = False,
    ):
        """`raw`: `on_message` gets the frames as they came (a monitor socket's events), not unpacked."""
        self.socket = socket
        self._on_message, self._on_error = on_message, on_error
        self._routed, self._raw = routed, raw
        self._loop = asyncio.get_running_loop()
        self._fd = socket.getsockopt(zmq.FD)
        self._outbox: dict[bytes | None, list] = {}
        self._flush_due = self._read_due = False
        self._closed = self._paused = False
        self._loop.add_reader(self._fd, self._read)
        self._read_soon()  # what came before the reader was added raises no edge

    def post(self, message: tuple, peer: bytes | None = None) -> None:
        """Queues `message` for `peer` (a ROUTER's routing id); sent with the others of this turn."""
        if self._closed:
            return
        self._outbox.setdefault(peer, []).append(message)
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def pause_reading(self) -> None:
        """Reads nothing until `resume_reading` (what comes waits in ZeroMQ's queue)."""
        self._paused = True

    def resume_reading(self) -> None:
        self._paused = False
        self._read_soon()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._fd)

    def _flush(self) -> None:
        self._flush_due = False
        outbox, self._outbox = self._outbox, {}
        if self._closed:
            return
        try:
            for peer, messages in outbox.items():
                frames = pack(messages)
                self.socket.send_multipart([peer, *frames] if self._routed else frames, copy=False)
        except zmq.ZMQError as exc:
            self._fail(exc)
            return
        self._read_soon()

    def _read_soon(self) -> None:
        if not self._read_due:
            self._read_due = True
            self._loop.call_soon(self._read)

    def _read(self) -> None:
        self._read_due = False
        if self._closed or self._paused:
            return
        try:
            for _ in range(MESSAGES_PER_TURN):
                if not self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    return
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
                if self._raw:
                    self._on_message(None, frames)
                    continue
                peer, frames = (frames[0].bytes, frames[1:]) if self._routed else (None, frames)
                for message in unpack(frames):
                    self._on_message(peer, message)
        except Exception as exc:  # the socket, or a message that cannot be read: the link is broken
            self._fail(exc)
            return
        self._read_soon()  # more may wait: read on after what else is ready has run

    def _fail(self, exc: BaseException) -> None:
        if not self._closed:
            self.close()
            self._on_error(exc)
