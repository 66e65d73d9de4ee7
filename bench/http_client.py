"""The bench's HTTP client: keep-alive HTTP/1.1 connections on asyncio streams, one request at a time
each, so the load generator's own cost stays small next to the server's (a general-purpose client such as
aiohttp or httpx costs the 2-core bench machine more CPU per call than grpc.aio does). Calls
`POST /bertserve/v1/embed`, whose reply carries the same metadata as gRPC Embed."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from bertserve.bench.loadgen import Call, CallFailed
from bertserve.bench.native_loadgen import NativeMethod


class HttpCallError(CallFailed):
    """A non-200 answer; `code` is the gRPC status name the server put in the error body."""

    def __init__(self, status: int, code: str):
        super().__init__(f"HTTP {status} {code}")
        self.status, self.code = status, code


class HttpPool:
    """Up to `size` keep-alive connections to host:port, each used by one request at a time."""

    def __init__(self, host: str, port: int, size: int):
        self.host, self.port = host, port
        self._idle: asyncio.LifoQueue = asyncio.LifoQueue()
        self._opened = 0
        self._size = size

    async def _connection(self):
        if self._idle.empty() and self._opened < self._size:
            self._opened += 1
            return await asyncio.open_connection(self.host, self.port)
        return await self._idle.get()

    async def post(self, path: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        reader, writer = await self._connection()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"X-Request-Timeout: {timeout_s}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            writer.write(head + body)
            lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
            status = int(lines[0].split(b" ", 2)[1])
            headers = dict(line.split(b": ", 1) for line in lines[1:] if b": " in line)
            payload = await reader.readexactly(int(headers[b"content-length"]))
        except BaseException:
            writer.close()
            self._opened -= 1
            raise
        if headers.get(b"connection") == b"close":
            writer.close()
            self._opened -= 1
        else:
            self._idle.put_nowait((reader, writer))
        return status, payload

    async def close(self) -> None:
        while not self._idle.empty():
            _, writer = self._idle.get_nowait()
            writer.close()


EMBED_PATH = "/bertserve/v1/embed"


def _body(texts: list[str], model: str) -> bytes:
    return json.dumps({"inputs": texts, "model": model, "truncate": True}).encode()


def _reply(payload: bytes) -> SimpleNamespace:
    return SimpleNamespace(metadata=SimpleNamespace(**json.loads(payload)["metadata"]))


def _failure(status: int, payload: bytes) -> str:
    """The gRPC status name the server put in an error body (HTTP status when it has none)."""
    try:
        return json.loads(payload)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}"


def embed_call(pool: HttpPool, model: str, timeout_s: float) -> Call:
    async def call(texts: list[str]) -> SimpleNamespace:
        status, payload = await pool.post(EMBED_PATH, _body(texts, model), timeout_s)
        if status != 200:
            raise HttpCallError(status, _failure(status, payload))
        return _reply(payload)

    return call


def native_embed(model: str) -> NativeMethod:
    """The same call as the native HTTP load generator sends it (bench/native/http_loadgen.cc)."""
    return NativeMethod(EMBED_PATH, lambda request: _body(request.texts, model), _reply, _failure)
