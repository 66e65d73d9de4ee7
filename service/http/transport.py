"""One HTTP/1.1 connection, parsed with `httptools` (llhttp, the parser uvicorn and Node use). It knows
nothing of routes: each complete request goes to the server's handler, `handler(Request) -> Response`.
Accepting, counting and TLS are in service/http/connections.py and accept.py.

What one connection may hold (`HttpLimits`; tests/test_http_robustness.py, test_http_hostile.py):
- request line and headers: at most `max_header_bytes` (+ one HEAD_SLICE) fed to the parser, counted as
  they arrive, so a header value that never ends gets 431 (more than `MAX_HEADERS` fields too);
- a body: at most `max_body_bytes` (413 as soon as Content-Length or the counted bytes say so), and its
  bytes count against the server's budget of bodies in flight (503 beyond it);
- bytes sent ahead while a request is answered (pipelining): at most 2 x READ_BYTES, then reading pauses;
  requests parsed ahead: those one HEAD_SLICE holds (the parser is fed request heads in slices);
- headers not complete `header_timeout_s` after a request's first byte, or a body `body_timeout_s` after
  its headers: 408; no new request `keep_alive_s` after an answer: closed; an answer the client does not
  read within `body_timeout_s` (also one still unsent when its connection closes): aborted; a malformed
  request or target: 400; `Expect` other than 100-continue: 417;
- an answer is written in REPLY_CHUNK pieces, each once the client has taken the last (more than
  WRITE_BUFFER_HIGH unsent pauses it; over TLS too, whose transport would take a whole reply at once): while it
  waits it counts whole in the server's budget of replies in flight (connections.py), the request and its
  response freed meanwhile.
A refusal is followed by a lingering close (writing shut, what the client still sends read and discarded
for LINGER_S) so the kernel does not reset the connection before the client reads its answer.
Requests on one connection are answered in order. The socket is read while a request is answered, so a
client that disconnects is seen at once: its handler is cancelled, which drops its queued inputs.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import struct
import termios
from collections import deque
from collections.abc import Callable

import httptools

from bertserve.service.http.messages import (  # noqa: F401  (Handler, json_bytes, json_response: the routes import them from here)
    Handler,
    HttpLimits,
    Reject,
    Request,
    Response,
    json_bytes,
    json_response,
    serialize,
)

log = logging.getLogger(__name__)

MAX_HEADERS = 100  # header fields per request
READ_BYTES = 32 * 1024  # one read from the socket
HEAD_SLICE = 4 * 1024  # request line and headers are fed to the parser in slices of this size, counted
LINGER_S = 2.0  # after a refusal, what the client still sends is discarded for this long at most
WRITE_BUFFER_HIGH = 16 * 1024  # unsent bytes a connection holds before it waits for its client
REPLY_CHUNK = 16 * 1024  # an answer goes to the transport in pieces of this size
_OUTQ = getattr(termios, "TIOCOUTQ", None)  # a socket's unsent bytes in the kernel (SIOCOUTQ on Linux)
_READ_BUFFER = memoryview(bytearray(READ_BYTES))  # shared: each read is parsed or copied before the next


class Connection(asyncio.BufferedProtocol):
    """`server` is the HttpServer (connections.py); `release()` gives back its accepted-connection slot."""

    def __init__(self, server, release: Callable[[], None]):
        self.server, self.limits, self.release = server, server.limits, release
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.pending: deque[tuple[Request, bool, int]] = deque()  # request, keep-alive, its body bytes
        self.task: asyncio.Task | None = None  # answering self.pending, in order
        self.timer: asyncio.TimerHandle | None = None
        self.in_message = False  # between a request's first byte and its end
        self.reading_head = True  # what the parser is fed is a request line and headers
        self.head_bytes = 0
        self.stash = bytearray()  # received while a request is answered; parsed after its answer
        self.reserved = 0  # body bytes of this connection counted in the server's budget
        self.answered = 0
        self.closing = False
        self.lingering = False  # refused: what the client still sends is discarded until it closes
        self.failure: tuple | None = None  # a refusal that waits for the answers before it
        self.peer_closed = False  # the client closed its side
        self.written = 0  # bytes given to the transport since the connection opened
        self.reply_held_at = 0.0  # the loop's time the answer being written began to wait for its client
        self.taken_at_hold = 0  # bytes the client had taken by then
        self._writable = asyncio.Event()
        self._writable.set()
        self._reset_message()

    def _reset_message(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body = bytearray()  # grows in place (large ones are mapped, and go back to the kernel freed)
        self.body_left = 0  # bytes of the body its Content-Length still announces

    # --- asyncio.Protocol ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        self.server.opened(self)
        self._arm(self.limits.header_timeout_s, None)  # a connection that never sends a request

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._disarm()
        self._writable.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client went away: its queued inputs are dropped
        self._release_body(self.reserved)
        self.server.closed(self)
        self.release()
        # The parser and this protocol refer to each other: drop the parser and every buffer now, so they
        # are freed with the connection rather than by a later full garbage collection.
        self.parser = None
        self.pending.clear()
        self.stash = bytearray()
        self._reset_message()

    def get_buffer(self, sizehint: int) -> memoryview:
        return _READ_BUFFER

    def buffer_updated(self, nbytes: int) -> None:
        if self.lingering or self.closing:
            return  # discarded
        if self.busy:
            self._keep(_READ_BUFFER[:nbytes])
        else:
            self._feed(_READ_BUFFER[:nbytes])

    def eof_received(self) -> None:
        self.peer_closed = True  # an answer being written stops (TLS closes the transport later)
        return None  # closed: a request being answered is cancelled (connection_lost)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # --- parsing -------------------------------------------------------------------------------------

    def _keep(self, data: memoryview) -> None:
        self.stash += data
        if len(self.stash) >= READ_BYTES:
            self.transport.pause_reading()

    def _feed(self, data: memoryview) -> None:
        try:
            while data and not self.closing:
                if self.busy:
                    self._keep(data)
                    return
                size = HEAD_SLICE if self.reading_head else max(HEAD_SLICE, self.body_left)
                chunk, data = data[:size], data[size:]
                in_head = self.reading_head
                self.parser.feed_data(chunk)
                if self.reading_head:
                    # a chunk that began in a body is fed up to the body's end: after it, at most a slice
                    # of the next request's head (its body bytes are not head bytes)
                    self._count_head(len(chunk) if in_head else min(len(chunk), HEAD_SLICE))
        except httptools.HttpParserUpgrade:
            pass  # no protocol upgrades: the request is answered as a plain HTTP/1.1 request
        except Reject as reject:
            self.fail(reject.status, reject.message, reject.headers)
        except httptools.HttpParserCallbackError as exc:
            reject = exc.__context__ if isinstance(exc.__context__, Reject) else None
            if reject is None:
                log.exception("HTTP parser callback failed")
                self.fail(500, "internal error reading the request")
            else:
                self.fail(reject.status, reject.message, reject.headers)
        except httptools.HttpParserError as exc:
            self.fail(400, f"malformed HTTP request: {exc}")

    def _count_head(self, size: int) -> None:
        self.head_bytes += size
        if self.head_bytes > self.limits.max_header_bytes:
            raise Reject(431, f"request line and headers: more than {self.limits.max_header_bytes} bytes")

    def on_message_begin(self) -> None:
        self.in_message = True
        self._reset_message()
        if not self.busy:
            self._arm(self.limits.header_timeout_s, "request headers")

    def on_url(self, url: bytes) -> None:
        self.url += url  # counted with the headers as fed

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_HEADERS:
            raise Reject(431, f"headers: more than {MAX_HEADERS} fields")
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.reading_head = False
        expect = self.headers.get("expect")
        if expect is not None and expect.lower() != "100-continue":
            raise Reject(417, f"expect: only 100-continue is supported (got {expect[:64]!r})")
        length = self.headers.get("content-length")
        # a body is fed whole, but not what follows it: one feed completes at most one HEAD_SLICE of
        # pipelined requests (each held as a Request until answered)
        self.body_left = int(length) if length is not None and length.isascii() and length.isdigit() else 0
        if self.body_left > self.limits.max_body_bytes:
            raise Reject(
                413,
                f"request body: {self.body_left} bytes is more than max_message_bytes {self.limits.max_body_bytes}",
            )
        if expect is not None and not self.server.draining:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not self.busy:
            self._arm(self.limits.body_timeout_s, "request body")

    def on_body(self, body: bytes) -> None:
        if len(self.body) + len(body) > self.limits.max_body_bytes:
            raise Reject(413, f"request body: more than max_message_bytes {self.limits.max_body_bytes} bytes")
        if not self.server.reserve_body(len(body)):
            budget = self.limits.max_body_bytes_in_flight
            raise Reject(
                503,
                f"request bodies being read: more than http_max_body_bytes_in_flight {budget} bytes "
                "in all; retry later",
                [("retry-after", "1")],
            )
        self.reserved += len(body)
        self.body += body
        self.body_left -= len(body)

    def on_message_complete(self) -> None:
        self.in_message, self.reading_head, self.head_bytes = False, True, 0
        try:
            url = httptools.parse_url(self.url)
            method = self.parser.get_method().decode("latin-1")
        except (httptools.HttpParserError, ValueError):
            raise Reject(400, f"request target: not a path or an absolute URL: {self.url[:128]!r}") from None
        body = bytes(self.body)
        request = Request(
            method=method,
            path=url.path.decode("latin-1") if url.path else "/",
            query=url.query.decode("latin-1") if url.query else "",
            headers=self.headers,
            body=body,
        )
        self.pending.append((request, self.parser.should_keep_alive(), len(body)))
        self._reset_message()
        self._disarm()
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._answer_pending())

    # --- answering -----------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A request of this connection is being answered (or waits its turn)."""
        return self.task is not None

    @property
    def idle_kept_alive(self) -> bool:
        """Answered at least once and waiting for its next request: what a new connection may evict. One
        whose answer is not all sent is not idle (closed, it would hold its socket without a slot)."""
        if self.busy or self.in_message or self.closing or self.stash or not self.answered:
            return False
        return not self.transport.get_write_buffer_size()

    async def _answer_pending(self) -> None:
        try:
            while self.pending and not self.closing:
                request, keep_alive, reserved = self.pending.popleft()
                head = request.method == "HEAD"
                try:
                    response = await self.server.handler(request)
                except Exception:  # the handler maps every error itself; this is a last resort
                    log.exception("HTTP handler failed")
                    response = self.server.reject_response(500, "internal error")
                del request
                self._release_body(reserved)
                close = not keep_alive or self.server.draining
                data = serialize(response, close, head)
                del response  # the answer's bytes alone stay while the client reads them
                written = await self._write(data)
                del data
                if not written:  # the client went away or was aborted: nothing more is answered
                    self.closing = True
                    return
                self.answered += 1
                if close:
                    self.close()
                    return
        finally:
            self.task = None
        if self.failure is not None:
            self.fail(*self.failure)
        elif not self.closing:
            self._arm(self.limits.header_timeout_s if self.in_message else self.limits.keep_alive_s, None)
            stash, self.stash = self.stash, bytearray()
            self.transport.resume_reading()
            if stash:
                self._feed(memoryview(stash))

    def _release_body(self, size: int) -> None:
        size = min(size, self.reserved)  # connection_lost may have released everything already
        self.reserved -= size
        self.server.release_body(size)

    async def _write(self, data: bytes) -> bool:
        """`data` in REPLY_CHUNK pieces, each once the client has taken the last but WRITE_BUFFER_HIGH; held
        in the server's budget of replies in flight while it waits. A client that takes nothing for
        `body_timeout_s` is aborted. False when the connection ended first."""
        view, held = memoryview(data), False
        try:
            for start in range(0, len(view) + REPLY_CHUNK, REPLY_CHUNK):
                if not self._writable.is_set():
                    if not held:
                        self.reply_held_at = asyncio.get_running_loop().time()
                        self.taken_at_hold = self.taken()
                        self.server.hold_reply(self, len(data))
                        held = True
                    try:
                        await asyncio.wait_for(self._writable.wait(), self.limits.body_timeout_s)
                    except TimeoutError:  # the client does not read its response
                        self.transport.abort()
                elif 0 < start < len(view):  # a turn between pieces: others go on, a lost client is seen
                    await asyncio.sleep(0)
                if self.closing or self.peer_closed or self.transport.is_closing():
                    return False
                if start < len(view):
                    piece = bytes(view[start : start + REPLY_CHUNK])  # queued alone, not a view of `data`
                    self.transport.write(piece)
                    self.written += len(piece)
            return True
        finally:
            if held:
                self.server.release_reply(self)

    def taken(self) -> int:
        """Bytes its client has taken since the connection opened (Linux: the kernel's unsent bytes counted as
        not taken; elsewhere only what the transport holds)."""
        unsent = self.transport.get_write_buffer_size() + _kernel_unsent(self.transport)
        return max(0, self.written - unsent)

    def reply_rate(self, now: float) -> float:
        """Bytes a second its client has taken since the answer being written began to wait for it: about 0
        for a client that reads nothing, whatever the kernel and the transport took at first."""
        return (self.taken() - self.taken_at_hold) / max(now - self.reply_held_at, 1e-3)

    # --- timers and closing --------------------------------------------------------------------------

    def _arm(self, seconds: float, waiting_for: str | None) -> None:
        self._disarm()
        self.timer = asyncio.get_running_loop().call_later(seconds, self._timed_out, waiting_for)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self, waiting_for: str | None) -> None:
        self.timer = None
        if self.busy:
            return
        if waiting_for is None or not self.in_message:
            self.close()  # idle: nothing was asked, nothing to answer
        else:
            self.fail(408, f"{waiting_for}: not received within the server's read timeout")

    def fail(self, status: int, message: str, headers: list[tuple[str, str]] | None = None) -> None:
        """Answers a request that cannot be read (never reached a handler), then a lingering close."""
        if self.closing:
            return
        if self.busy:  # answers to earlier pipelined requests go first
            self.failure = (status, message, headers)
            self.transport.pause_reading()
            return
        self.failure = None
        self.server.rejected_request(status)
        response = self.server.reject_response(status, message)
        response.headers.extend(headers or [])
        self.transport.write(serialize(response, close=True))
        self._release_body(self.reserved)
        self._reset_message()
        self.closing = True
        self._disarm()
        if not self.transport.can_write_eof():  # TLS: no half-close
            self.close()
            return
        self.transport.write_eof()
        self.lingering = True
        self.transport.resume_reading()
        self.timer = asyncio.get_running_loop().call_later(LINGER_S, self.close)

    def close(self) -> None:
        self.closing = True
        self._disarm()
        self.transport.close()  # sends what it holds first: a client that does not read it is aborted
        if self.transport.get_write_buffer_size():
            self.timer = asyncio.get_running_loop().call_later(
                self.limits.body_timeout_s, self.transport.abort
            )

    def close_if_idle(self) -> None:
        if not (self.busy or self.in_message or self.closing):
            self.close()


def _kernel_unsent(transport: asyncio.Transport) -> int:
    sock = transport.get_extra_info("socket")
    if sock is None or _OUTQ is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return 0
