"""The /metrics endpoint: a small HTTP/1.1 server bounded against slow and idle clients.

prometheus_client's own server runs a thread per connection and never times a connection out, so idle
or slow connections pile up threads (600 slow connections made 619 threads). This one runs on one
thread of its own with its own event loop (a slow or hostile scraper never touches the gRPC event loop):

- one connection, one request: the request head must arrive within `request_timeout_s` of connecting
  (a total deadline, so trickling bytes does not extend it) and fit `max_request_bytes`; the reply must
  be taken within `write_timeout_s`; then the connection is closed (`Connection: close`);
- at most `max_connections` connections: at the cap, the connection that has been waiting longest for
  its request head is dropped to make room, so a fresh scrape is served even while idle connections
  fill the cap (when every connection is already being answered, the new one is closed instead);
- GET and HEAD of `/metrics` only (query strings ignored); every other path is 404, other methods 405.

Content negotiation (OpenMetrics or the text format, gzip) follows the scraper's Accept headers, as
prometheus_client's server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
from http import HTTPStatus

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

METRICS_PATH = "/metrics"
MAX_CONNECTIONS = 64
REQUEST_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
MAX_REQUEST_BYTES = 8192


class MetricsHTTPServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
        max_request_bytes: int = MAX_REQUEST_BYTES,
    ):
        self.registry = registry
        self.max_connections = max_connections
        self.request_timeout_s = request_timeout_s
        self.write_timeout_s = write_timeout_s
        self.max_request_bytes = max_request_bytes
        self.port: int | None = None
        self.evicted = 0  # connections dropped at the cap to make room (for tests and logs)
        self._waiting: dict[asyncio.StreamWriter, None] = {}  # no request head yet, oldest first
        self._answering: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    @property
    def connections(self) -> int:
        return len(self._waiting) + len(self._answering)

    def start(self, host: str, port: int) -> int:
        """Binds and serves in a daemon thread; returns the bound port. Raises OSError if it cannot bind."""
        bound = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._main(host, port, bound, failure)),
            name="bertserve-metrics",
            daemon=True,
        )
        self._thread.start()
        bound.wait()
        if failure:
            self._thread.join()
            raise failure[0]
        assert self.port is not None
        return self.port

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is None or self._loop is None or self._stopping is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already ended
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)
        self._thread = None

    async def _main(self, host: str, port: int, bound: threading.Event, failure: list) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            server = await asyncio.start_server(
                self._connected, host, port, limit=self.max_request_bytes, reuse_address=True
            )
        except OSError as exc:
            failure.append(exc)
            bound.set()
            return
        self.port = server.sockets[0].getsockname()[1]
        bound.set()
        async with server:
            await self._stopping.wait()
            server.close()
            for writer in [*self._waiting, *self._answering]:
                writer.transport.abort()
            await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.connections >= self.max_connections:
            if not self._waiting:
                writer.transport.abort()
                return
            oldest = next(iter(self._waiting))
            del self._waiting[oldest]
            oldest.transport.abort()
            self.evicted += 1
        self._waiting[writer] = None
        handler = asyncio.current_task()
        self._handlers.add(handler)
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.request_timeout_s)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            if self._waiting.pop(writer, False) is False:
                return  # evicted meanwhile
            self._answering.add(writer)
            writer.write(self._reply(head))
            writer.close()  # after the buffered reply is sent
            with contextlib.suppress(TimeoutError, ConnectionError):
                await asyncio.wait_for(writer.wait_closed(), self.write_timeout_s)
        finally:
            self._waiting.pop(writer, None)
            self._answering.discard(writer)
            self._handlers.discard(handler)
            writer.transport.abort()  # no-op once closed; a reader too slow for write_timeout_s is cut off

    def _reply(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _response(HTTPStatus.BAD_REQUEST, b"bad request line\n")
        method, target, _ = parts
        if target.split("?", 1)[0] != METRICS_PATH:
            return _response(HTTPStatus.NOT_FOUND, f"only {METRICS_PATH} is served here\n".encode())
        if method not in ("GET", "HEAD"):
            return _response(HTTPStatus.METHOD_NOT_ALLOWED, b"GET or HEAD\n", {"Allow": "GET, HEAD"})
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry)
        extra = {"Content-Type": content_type}
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=5)
            extra["Content-Encoding"] = "gzip"
        return _response(HTTPStatus.OK, body, extra, head_only=method == "HEAD")


def _response(
    status: HTTPStatus, body: bytes, headers: dict[str, str] | None = None, head_only: bool = False
) -> bytes:
    fields = {"Content-Type": "text/plain; charset=utf-8", **(headers or {})}
    fields.update({"Content-Length": str(len(body)), "Connection": "close"})
    lines = [f"HTTP/1.1 {status.value} {status.phrase}", *(f"{k}: {v}" for k, v in fields.items())]
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + (b"" if head_only else body)
