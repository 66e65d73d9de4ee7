"""Accepting TCP connections ourselves (not with asyncio's server), so every accepted socket is counted
before anything else happens to it, TLS included (service/http/connections.py):

- `Listener`: listening sockets on the running loop; when the process is out of file descriptors it pauses
  accepting for a moment and logs one line (at most every LOG_EVERY_S), never a traceback per attempt;
- `first_byte`: waits for a connection's first byte without reading it (a TLS handshake starts with 0x16);
- `Lingering`: answers a socket with a few bytes and closes it gracefully (see its docstring);
- `raise_fd_limit`: the open-files soft limit raised to the hard limit.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
PAUSE_S = 0.5  # accepting pauses this long when the process is out of file descriptors
LOG_EVERY_S = 10.0
ACCEPTS_PER_WAKEUP = 64


def raise_fd_limit() -> int:
    """Raises this process's open-files soft limit to its hard limit (common practice for servers);
    returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


class Listener:
    """Accepts connections on (host, port) and hands each socket (non-blocking) to `admit`."""

    def __init__(self, admit: Callable[[socket.socket], None], backlog: int = 1024):
        self.admit, self.backlog = admit, backlog
        self.sockets: list[socket.socket] = []
        self.out_of_resources = 0  # accept() failures for want of file descriptors
        self._logged_at = -LOG_EVERY_S
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self, host: str, port: int, reuse_port: bool = False) -> int:
        """Binds every address `host` resolves to; returns the bound port (`port` 0 picks a free one).
        `reuse_port`: shared with this server's other front processes (the supervisor holds the port)."""
        self._loop = loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        try:
            for family, kind, proto, _, address in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                self.sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if port == 0 and len(self.sockets) > 1:  # every address on the port the first one got
                    address = (address[0], self.sockets[0].getsockname()[1], *address[2:])
                sock.bind(address)
                sock.listen(self.backlog)
                sock.setblocking(False)
        except OSError:
            self.close()
            raise
        for sock in self.sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)
        return self.sockets[0].getsockname()[1]

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_WAKEUP):
            try:
                sock, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in OUT_OF_RESOURCES:
                    self._pause(listening, exc)
                return  # a connection reset before it was accepted, or alike: the next one is tried later
            sock.setblocking(False)
            self.admit(sock)

    def _pause(self, listening: socket.socket, exc: OSError) -> None:
        self.out_of_resources += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            log.warning(
                "HTTP: cannot accept connections: %s (open files limit %d; %d times so far); pausing %.1fs",
                exc.strerror,
                limit,
                self.out_of_resources,
                PAUSE_S,
            )
        fd = listening.fileno()
        self._loop.remove_reader(fd)
        self._loop.call_later(PAUSE_S, self._resume, listening)

    def _resume(self, listening: socket.socket) -> None:
        if listening in self.sockets:
            self._loop.add_reader(listening.fileno(), self._accept, listening)

    def close(self) -> None:
        for sock in self.sockets:
            if self._loop is not None and sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
            sock.close()
        self.sockets = []


def _set(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


async def first_byte(sock: socket.socket) -> bytes:
    """The connection's first byte, left unread (b"" when the client closed first)."""
    loop = asyncio.get_running_loop()
    while True:
        readable = loop.create_future()
        loop.add_reader(sock.fileno(), _set, readable)
        try:
            await readable
        finally:
            loop.remove_reader(sock.fileno())
        try:
            return sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            return b""


class Lingering:
    """Sends `answer` on `sock`, shuts down writing, then reads and discards what the client still sends
    until it closes or `seconds` pass, and closes: closing with unread bytes would make the kernel reset
    the connection, and the client could lose the answer. `seconds` 0: what has arrived is discarded and
    the socket closed at once. `done()` is called once closed."""

    def __init__(self, sock: socket.socket, answer: bytes, seconds: float, done: Callable[[], None]):
        self.sock, self.done, self.closed = sock, done, False
        self.loop = asyncio.get_running_loop()
        self.fd = sock.fileno()
        self.timer = None
        if not self._discard():
            return
        try:
            sock.send(answer)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            self.close()
            return
        if seconds <= 0:
            self.close()
            return
        self.loop.add_reader(self.fd, self._readable)
        self.timer = self.loop.call_later(seconds, self.close)

    def _discard(self) -> bool:
        """Reads what has arrived; False (and closed) when the client closed or the socket failed."""
        try:
            while self.sock.recv(65536):
                pass
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            pass
        self.close()
        return False

    def _readable(self) -> None:
        self._discard()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.loop.remove_reader(self.fd)
        self.sock.close()
        self.done()
