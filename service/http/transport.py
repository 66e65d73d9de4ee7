"""A lean HTTP/1.1 server on the running asyncio loop (the loop grpc.aio uses), parsing with `httptools`
(llhttp, the parser uvicorn and Node use). It knows nothing of routes: each complete request goes to one
async handler, `handler(Request) -> Response`.

Hostile clients meet these bounds (`HttpLimits`; tests/test_http_robustness.py):
- `max_connections` open connections: a new one closes the connection idle for longest (waiting between
  requests, or still sending one); when every connection is being answered, the new one gets 503;
- request line and headers over `max_header_bytes` (or `MAX_HEADERS` fields): 431, closed;
- a body over `max_body_bytes`: 413 as soon as Content-Length says so (the body is never read), or as
  soon as the counted bytes of a chunked body pass the limit; closed;
- headers not complete `header_timeout_s` after the first byte of a request, or a body not complete
  `body_timeout_s` after the headers: 408, closed (slow clients);
- no new request `keep_alive_s` after the last answer: closed silently (idle keep-alive connections);
- a response the client does not read within `body_timeout_s`: the connection is aborted;
- a malformed request (bad request line, bad chunk framing...): 400, closed.
Requests on one connection are answered in order (pipelined ones wait; reading pauses meanwhile). A
client that disconnects cancels its request's handler, which cancels its queued inputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import httptools

log = logging.getLogger(__name__)

MAX_HEADERS = 100  # header fields per request


@dataclass(frozen=True)
class HttpLimits:
    max_body_bytes: int
    max_header_bytes: int = 32 * 1024  # request line and header fields together
    max_connections: int = 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 30.0


@dataclass
class Request:
    method: str
    path: str  # percent-encoded, as sent
    query: str
    headers: dict[str, str]  # lower-case names; repeated fields joined with ", "
    body: bytes


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Awaitable[Response]]


def json_response(status: int, value: object, headers: list[tuple[str, str]] | None = None) -> Response:
    body = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    return Response(status, body, "application/json", headers or [])


class _Reject(Exception):
    """Raised inside a parser callback: answer `status` with `message` and close the connection."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _serialize(response: Response, close: bool) -> bytes:
    reason = HTTPStatus(response.status).phrase if response.status in HTTPStatus._value2member_map_ else ""
    lines = [f"HTTP/1.1 {response.status} {reason}"]
    if response.content_type:
        lines.append(f"content-type: {response.content_type}")
    lines.append(f"content-length: {len(response.body)}")
    lines.extend(f"{name}: {value}" for name, value in response.headers)
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer):
        self.server = server
        self.limits = server.limits
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.pending: deque[tuple[Request, bool]] = deque()  # complete requests, with keep-alive
        self.task: asyncio.Task | None = None  # answering self.pending, in order
        self.timer: asyncio.TimerHandle | None = None
        self.in_message = False  # between a request's first byte and its end
        self.closing = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._reset_message()

    def _reset_message(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.header_name = b""
        self.header_value = b""
        self.header_bytes = 0
        self.body: list[bytes] = []
        self.body_bytes = 0

    # --- asyncio.Protocol ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        if len(self.server.connections) >= self.limits.max_connections and not self.server.evict_idle():
            self.server.refused_connections += 1
            message = f"too many connections (max {self.limits.max_connections}); retry later"
            self._fail(503, message, [("retry-after", "1")])
            return
        self.server.connections[self] = None
        self._arm(self.limits.header_timeout_s, None)  # a connection that never sends a request

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.pop(self, None)
        self._disarm()
        self._writable.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client went away: its queued inputs are dropped

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no protocol upgrades: the request is answered as a plain HTTP/1.1 request
        except httptools.HttpParserCallbackError as exc:
            reject = exc.__context__ if isinstance(exc.__context__, _Reject) else None
            if reject is None:
                log.exception("HTTP parser callback failed")
                self._fail(500, "internal error reading the request")
            else:
                self._fail(reject.status, reject.message)
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}")

    # --- httptools callbacks -------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self._reset_message()
        if not self.busy:
            self._arm(self.limits.header_timeout_s, "request headers")

    def _count_header_bytes(self, size: int) -> None:
        self.header_bytes += size
        if self.header_bytes > self.limits.max_header_bytes:
            raise _Reject(431, f"request line and headers: more than {self.limits.max_header_bytes} bytes")

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value) + 4)
        if len(self.headers) >= MAX_HEADERS:
            raise _Reject(431, f"headers: more than {MAX_HEADERS} fields")
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        length = self.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limits.max_body_bytes:
            raise _Reject(
                413,
                f"request body: {int(length)} bytes is more than max_message_bytes {self.limits.max_body_bytes}",
            )
        if self.headers.get("expect", "").lower() == "100-continue" and not self.server.draining:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not self.busy:
            self._arm(self.limits.body_timeout_s, "request body")

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.limits.max_body_bytes:
            raise _Reject(
                413, f"request body: more than max_message_bytes {self.limits.max_body_bytes} bytes"
            )
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        url = httptools.parse_url(self.url)
        request = Request(
            method=self.parser.get_method().decode("latin-1"),
            path=url.path.decode("latin-1") if url.path else "/",
            query=url.query.decode("latin-1") if url.query else "",
            headers=self.headers,
            body=b"".join(self.body),
        )
        self.pending.append((request, self.parser.should_keep_alive()))
        self._reset_message()
        self._disarm()
        self.transport.pause_reading()
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._answer_pending())

    # --- answering -----------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A request of this connection is being answered (or waits its turn)."""
        return self.task is not None

    async def _answer_pending(self) -> None:
        try:
            while self.pending and not self.closing:
                request, keep_alive = self.pending.popleft()
                try:
                    response = await self.server.handler(request)
                except Exception:  # the handler maps every error itself; this is a last resort
                    log.exception("HTTP handler failed")
                    response = self.server.reject_response(500, "internal error")
                close = not keep_alive or self.server.draining
                await self._write(_serialize(response, close))
                if close:
                    self.close()
                    return
        finally:
            self.task = None
        if not self.closing:
            if self.in_message:
                self._arm(self.limits.header_timeout_s, "request headers")
            else:
                self._arm(self.limits.keep_alive_s, None)
            self.transport.resume_reading()

    async def _write(self, data: bytes) -> None:
        self.transport.write(data)
        if not self._writable.is_set():
            try:
                await asyncio.wait_for(self._writable.wait(), self.limits.body_timeout_s)
            except TimeoutError:  # the client does not read its response
                self.transport.abort()

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
            self.server.timed_out_requests += 1
            self._fail(408, f"{waiting_for}: not received within the server's read timeout")

    def _fail(self, status: int, message: str, headers: list[tuple[str, str]] | None = None) -> None:
        """Answers a request that cannot be read (never reached a handler) and closes the connection."""
        if self.closing:
            return
        self.server.rejected[status] = self.server.rejected.get(status, 0) + 1
        response = self.server.reject_response(status, message)
        response.headers.extend(headers or [])
        self.transport.write(_serialize(response, close=True))
        self.close()

    def close(self) -> None:
        self.closing = True
        self._disarm()
        self.transport.close()

    def close_if_idle(self) -> None:
        if not self.busy and not self.in_message:
            self.close()


class HttpServer:
    """Listens on (host, port) on the running loop; `handler` answers every complete request.

    `reject_response(status, message)` builds the body of a request refused before routing (413, 431...).
    """

    def __init__(
        self,
        handler: Handler,
        limits: HttpLimits,
        reject_response: Callable[[int, str], Response],
    ):
        self.handler = handler
        self.limits = limits
        self.reject_response = reject_response
        self.connections: dict[_Connection, None] = {}  # in the order they were opened
        self.draining = False  # answers carry "connection: close"
        self.refused_connections = 0
        self.evicted_connections = 0
        self.timed_out_requests = 0
        self.rejected: dict[int, int] = {}  # status -> requests refused before reaching the handler
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Starts listening (HTTPS with `tls`; the handshake within header_timeout_s); returns the bound
        port (`port` 0 picks a free one)."""
        loop = asyncio.get_running_loop()
        handshake = {"ssl_handshake_timeout": self.limits.header_timeout_s} if tls is not None else {}
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, reuse_address=True, backlog=1024, ssl=tls, **handshake
        )
        return self._server.sockets[0].getsockname()[1]

    def evict_idle(self) -> bool:
        """Closes the oldest connection that is not being answered; False when there is none."""
        for connection in self.connections:
            if not connection.busy:
                self.evicted_connections += 1
                self.connections.pop(connection)
                connection.close()
                return True
        return False

    def drain(self) -> None:
        """Answers from now on close their connection; idle connections are closed now."""
        self.draining = True
        for connection in list(self.connections):
            connection.close_if_idle()

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stops listening, lets requests being answered finish for up to `grace_s`, then aborts."""
        self.drain()
        if self._server is not None:
            self._server.close()
        busy = [c.task for c in self.connections if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=grace_s)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), grace_s)
            self._server = None
