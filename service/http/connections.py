"""The HTTP server: accepted connections counted against `max_connections` from accept (TLS handshakes
included), the budget of request bodies in flight, eviction, drain and stop, and what it counts.

- A connection takes a slot at accept. Beyond `max_connections`, the oldest connection idle between
  requests after an answer (keep-alive) is closed for it; with none, the new one is refused: 503 and a
  lingering close on plain HTTP (a TLS connection is closed). A connection whose request may be in
  flight is never evicted. Refusals being closed are at most `max_connections` more sockets.
- TLS: the handshake is ours (`loop.connect_accepted_socket`), within `header_timeout_s` of accept; a
  first byte that is not a TLS handshake record gets a plaintext 400 (as nginx answers plain HTTP sent to
  an HTTPS port).
- Bodies of requests being read or answered hold at most `max_body_bytes_in_flight` bytes in all; beyond,
  503 (transport.py).
- Replies waiting for their client (more than WRITE_BUFFER_HIGH unsent) hold at most
  `max_reply_bytes_in_flight` bytes in all: beyond, the waiting connection whose client takes its reply the
  slowest is aborted (counted `unread`), so clients that read are the last to go.

Memory: about max_connections x (max_header_bytes + 2 x READ_BYTES + the Request objects of one HEAD_SLICE of
pipelined requests + WRITE_BUFFER_HIGH + REPLY_CHUNK unsent) + max_body_bytes_in_flight (+ one body copied while
a request is made of it) + max_reply_bytes_in_flight (+ one reply over it), and with TLS asyncio's read buffer
(256 KiB) and its socket transport's unsent bytes (64 KiB) per connection.
Counts (`HttpEvents`, exported by service/metrics.py): connections by outcome (accepted, refused,
evicted, handshake_failed, handshake_timeout, not_tls, unread), open connections, requests refused before routing
by status.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import ssl
from collections.abc import Callable

from bertserve.service.http.accept import Lingering, Listener, first_byte
from bertserve.service.http.transport import LINGER_S, Connection, Handler, HttpLimits, Response, serialize
from bertserve.service.memory import release_free_memory

TRIM_AFTER_BYTES = 16 * 1024 * 1024  # bodies freed since the last trim before the heap is trimmed
NOT_TLS = "plain HTTP request sent to the HTTPS port"


class HttpEvents:
    """What the server counts, as it happens (service/metrics.py exports it); nothing by default."""

    def connection(self, outcome: str) -> None: ...

    def open_connections(self, count: int) -> None: ...

    def rejected(self, status: int) -> None: ...


class HttpServer:
    """Listens on (host, port) on the running loop; `handler` answers every complete request.

    `reject_response(status, message)` builds the body of a request refused before routing (413, 431...).
    """

    def __init__(
        self,
        handler: Handler,
        limits: HttpLimits,
        reject_response: Callable[[int, str], Response],
        events: HttpEvents | None = None,
    ):
        self.handler, self.limits, self.reject_response = handler, limits, reject_response
        self.events = events or HttpEvents()
        self.connections: dict[Connection, None] = {}  # after connection_made, in the order they were opened
        self.open = (
            0  # accepted sockets holding a slot (handshaking, connected, lingering after a 400/408...)
        )
        self.lingering = 0  # refused sockets being closed gracefully
        self.body_bytes = 0  # bytes of request bodies in flight
        self.reply_bytes = 0  # bytes of replies their clients have not taken
        self._replies: dict[Connection, int] = {}  # connections waiting for their client -> the reply's size
        self.draining = False  # answers carry "connection: close"
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.rejected: collections.Counter[int] = collections.Counter()  # status -> requests refused unrouted
        self.tls: ssl.SSLContext | None = None
        self._listener = Listener(self._admit)
        self._starting: set[asyncio.Task] = set()
        self._lingerers: set[Lingering] = set()
        self._freed_since_trim = 0
        self._trimming = False

    async def start(
        self, host: str, port: int, tls: ssl.SSLContext | None = None, reuse_port: bool = False
    ) -> int:
        """Starts listening (HTTPS with `tls`); returns the bound port (`port` 0 picks a free one)."""
        self.tls = tls
        return await self._listener.start(host, port, reuse_port)

    # --- counts --------------------------------------------------------------------------------------

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self.events.connection(outcome)

    def rejected_request(self, status: int) -> None:
        self.rejected[status] += 1
        self.events.rejected(status)

    @property
    def evicted_connections(self) -> int:
        return self.outcomes["evicted"]

    @property
    def refused_connections(self) -> int:
        return self.outcomes["refused"]

    # --- admission -----------------------------------------------------------------------------------

    def _admit(self, sock: socket.socket) -> None:
        if self.open >= self.limits.max_connections and not self._evict_idle():
            self._count("refused")
            if self.tls is not None:  # no answer is possible before a handshake
                sock.close()
                return
            message = f"too many connections (max {self.limits.max_connections}); retry later"
            self.rejected_request(503)
            response = self.reject_response(503, message)
            response.headers.append(("retry-after", "1"))
            linger = self.lingering < self.limits.max_connections  # else closed once answered
            self.lingering += 1
            self._linger(sock, serialize(response, close=True), LINGER_S if linger else 0, self._lingered)
            return
        self._count("accepted")
        self.open += 1
        self.events.open_connections(self.open)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.open -= 1
                self.events.open_connections(self.open)

        task = asyncio.get_running_loop().create_task(self._connect(sock, release))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def _lingered(self) -> None:
        self.lingering -= 1

    def _linger(self, sock: socket.socket, answer: bytes, seconds: float, done: Callable[[], None]) -> None:
        """A lingering close (accept.Lingering), closed at once by stop()."""
        held: list[Lingering] = []

        def closed() -> None:
            if held:
                self._lingerers.discard(held[0])
            done()

        lingering = Lingering(sock, answer, seconds, closed)
        if not lingering.closed:
            held.append(lingering)
            self._lingerers.add(lingering)

    async def _connect(self, sock: socket.socket, release: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        if self.tls is None:
            try:
                await loop.connect_accepted_socket(lambda: Connection(self, release), sock)
            except BaseException:
                release()
                raise
            return
        started = loop.time()
        try:
            async with asyncio.timeout(self.limits.header_timeout_s):
                first = await first_byte(sock)
        except BaseException as exc:
            sock.close()
            release()
            if isinstance(exc, TimeoutError):
                self._count("handshake_timeout")
                return
            raise
        if not first:
            sock.close()
            release()
            return
        if first[0] != 0x16:  # not a TLS handshake record: plain HTTP, most likely
            self._count("not_tls")
            self.rejected_request(400)
            answer = serialize(self.reject_response(400, NOT_TLS), close=True)
            self._linger(sock, answer, LINGER_S, release)
            return
        left = max(0.001, self.limits.header_timeout_s - (loop.time() - started))
        try:
            await loop.connect_accepted_socket(
                lambda: Connection(self, release), sock, ssl=self.tls, ssl_handshake_timeout=left
            )
        except BaseException as exc:  # asyncio closed the socket
            release()
            if isinstance(exc, ConnectionAbortedError):
                self._count("handshake_timeout")
            elif isinstance(exc, OSError):
                self._count("handshake_failed")
            else:
                raise

    def opened(self, connection: Connection) -> None:
        self.connections[connection] = None

    def closed(self, connection: Connection) -> None:
        self.connections.pop(connection, None)

    def _evict_idle(self) -> bool:
        """Closes the oldest connection idle between requests after an answer; False when there is none."""
        for connection in self.connections:
            if connection.idle_kept_alive:
                self._count("evicted")
                self.connections.pop(connection)
                connection.close()
                connection.release()  # its slot is the new connection's now
                return True
        return False

    # --- bodies in flight ----------------------------------------------------------------------------

    def reserve_body(self, size: int) -> bool:
        if self.body_bytes + size > self.limits.max_body_bytes_in_flight:
            return False
        self.body_bytes += size
        return True

    def release_body(self, size: int) -> None:
        self.body_bytes -= size
        self._freed_since_trim += size
        if self.body_bytes == 0 and self._freed_since_trim >= TRIM_AFTER_BYTES and not self._trimming:
            # what glibc kept of the freed bodies goes back to the kernel (service/memory.py)
            self._trimming, self._freed_since_trim = True, 0
            loop = asyncio.get_running_loop()
            loop.run_in_executor(None, release_free_memory).add_done_callback(self._trimmed)

    def _trimmed(self, _) -> None:
        self._trimming = False

    # --- replies in flight ---------------------------------------------------------------------------

    def hold_reply(self, connection: Connection, size: int) -> None:
        """`connection` waits for its client to take a reply of `size` bytes. While the replies waiting pass
        the budget, the connection (not this one) whose client takes its reply the slowest is aborted."""
        self._replies[connection] = size
        self.reply_bytes += size
        if self.reply_bytes <= self.limits.max_reply_bytes_in_flight:
            return
        now = asyncio.get_running_loop().time()
        # the slowest first; of equal ones (none taken since they began to wait) the oldest
        waiting = (c for c in self._replies if c is not connection)
        for slowest in sorted(waiting, key=lambda c: (c.reply_rate(now), c.reply_held_at)):
            if self.reply_bytes <= self.limits.max_reply_bytes_in_flight:
                break
            self.release_reply(slowest)
            self._count("unread")
            slowest.transport.abort()

    def release_reply(self, connection: Connection) -> None:
        self.reply_bytes -= self._replies.pop(connection, 0)

    # --- drain and stop ------------------------------------------------------------------------------

    def drain(self) -> None:
        """Answers from now on close their connection; idle connections are closed now."""
        self.draining = True
        for connection in list(self.connections):
            connection.close_if_idle()

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stops listening, lets requests being answered finish for up to `grace_s`, then aborts."""
        self.drain()
        self._listener.close()
        for task in list(self._starting):
            task.cancel()
        for lingering in list(self._lingerers):
            lingering.close()
        busy = [c.task for c in self.connections if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=grace_s)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)  # connection_lost callbacks run
