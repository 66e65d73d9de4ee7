"""The servers under attack (docs/http-servers/attacks.py starts each as a subprocess):
`python servers.py NAME PORT [CERT KEY]` serves a minimal app on 127.0.0.1:PORT (HTTPS with CERT/KEY)
on the process's asyncio loop, the loop bertserve shares with grpc.aio.

The app is what bertserve's HTTP routes need from a server, and nothing more:
- GET /health: 200 "ok";
- POST /echo: reads the whole body (413 past MAX_BODY) and answers its length;
- POST /slow?s=N: "works" N seconds while watching for the client leaving (ASGI: a concurrent
  `receive()` returning http.disconnect; otherwise: the handler cancelled by the server);
- GET /stats: the app's counters (JSON); /smuggled counts requests that reached it.

Each server gets its own safety settings, listed in SETTINGS (the same policy where a server has the knob:
1024 connections, backlog 1024, 32 KiB of headers, 10 s to send headers or finish a TLS handshake).
"""

from __future__ import annotations

import asyncio
import collections
import json
import ssl
import sys
from pathlib import Path

MAX_BODY = 8 * 1024 * 1024  # bertserve's default max_message_bytes
STATS: collections.Counter = collections.Counter()

SETTINGS = {
    "uvicorn-h11": "limit_concurrency=1024, backlog=1024, h11_max_incomplete_event_size=32768, "
    "timeout_keep_alive=30 (no header/read timeout or TLS handshake timeout knob: asyncio's 60 s)",
    "uvicorn-httptools": "limit_concurrency=1024, backlog=1024, timeout_keep_alive=30 "
    "(no header size, header/read timeout or TLS handshake timeout knob)",
    "hypercorn": "backlog=1024, h11_max_incomplete_size=32768, read_timeout=10, keep_alive_timeout=30, "
    "ssl_handshake_timeout=10 (no connection limit knob)",
    "granian-embed": "embedded Server (ASGI, no lifespan) on the process loop, http=1, runtime_threads=1, "
    "backlog=1024, backpressure=1024, HTTP1Settings(header_read_timeout=10000 ms, max_buffer_size=32768), "
    "TLS 1.3 (no connection limit or TLS handshake timeout knob)",
    "aiohttp": "web.AppRunner(handler_cancellation=True, keepalive_timeout=30, max_line_size=8190, "
    "max_field_size=8190, max_headers=128 (its defaults)), client_max_size=8 MiB, TCPSite(backlog=1024) "
    "(no connection limit, header timeout or TLS handshake timeout knob)",
    "bertserve": "service/http/transport.py HttpServer, HttpLimits(max_body_bytes=8 MiB, max_header_bytes=32768, "
    "max_connections=1024, header_timeout_s=10 (also the TLS handshake timeout), body_timeout_s=10, "
    "keep_alive_s=30), backlog=1024",
}


def route(method: str, path: str, length: int) -> tuple[int, bytes]:
    if path == "/health":
        return 200, b"ok"
    if path == "/echo" and method == "POST":
        return 200, str(length).encode()
    if path == "/stats":
        return 200, json.dumps(STATS).encode()
    if path == "/smuggled":
        STATS["smuggled"] += 1
    return 404, b"not found"


def seconds_of(query: str) -> float:
    for part in query.split("&"):
        if part.startswith("s="):
            return float(part[2:])
    return 1.0


async def slow(seconds: float, wait_disconnect=None) -> bool:
    """Works `seconds`; returns False when the client left first (the app was told)."""
    work = asyncio.ensure_future(asyncio.sleep(seconds))
    watch = asyncio.ensure_future(wait_disconnect()) if wait_disconnect else None
    try:
        await asyncio.wait([t for t in (work, watch) if t], return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        STATS["slow_cancelled"] += 1
        work.cancel()
        if watch:
            watch.cancel()
        raise
    if work.done():
        STATS["slow_completed"] += 1
        if watch:
            watch.cancel()
        return True
    STATS["slow_told"] += 1
    work.cancel()
    return False


# --- ASGI (uvicorn, hypercorn, granian) -----------------------------------------------------------------


async def asgi_app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body, length, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            STATS["disconnect_in_body"] += 1
            return
        chunk = message.get("body", b"")
        length += len(chunk)
        if length > MAX_BODY:
            await answer(send, 413, b"body too large")
            return
        body.append(chunk)
        more = message.get("more_body", False)
    path, method = scope["path"], scope["method"]
    if path == "/slow":
        query = scope.get("query_string", b"").decode("latin-1")

        async def disconnected():
            while (await receive())["type"] != "http.disconnect":
                pass

        if not await slow(seconds_of(query), disconnected):
            return
        status, out = 200, b"done"
    else:
        status, out = route(method, path, length)
    await answer(send, status, out)


async def answer(send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def run_uvicorn(port: int, http: str, cert: str | None, key: str | None) -> None:
    import uvicorn

    config = uvicorn.Config(
        asgi_app,
        host="127.0.0.1",
        port=port,
        http=http,
        lifespan="off",
        access_log=False,
        log_level="warning",
        limit_concurrency=1024,
        backlog=1024,
        timeout_keep_alive=30,
        h11_max_incomplete_event_size=32768,
        ssl_certfile=cert,
        ssl_keyfile=key,
    )
    await uvicorn.Server(config).serve()


async def run_hypercorn(port: int, cert: str | None, key: str | None) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.backlog = 1024
    config.h11_max_incomplete_size = 32768
    config.read_timeout = 10
    config.keep_alive_timeout = 30
    config.ssl_handshake_timeout = 10
    config.accesslog = None
    config.certfile, config.keyfile = cert, key
    await serve(asgi_app, config, mode="asgi")


async def run_granian(port: int, cert: str | None, key: str | None) -> None:
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.log import LogLevels
    from granian.server.embed import Server

    server = Server(
        asgi_app,
        address="127.0.0.1",
        port=port,
        interface=Interfaces.ASGINL,
        http=HTTPModes.http1,
        websockets=False,
        runtime_threads=1,
        backlog=1024,
        backpressure=1024,
        http1_settings=HTTP1Settings(header_read_timeout=10_000, keep_alive=True, max_buffer_size=32768),
        log_level=LogLevels.warning,
        ssl_cert=Path(cert) if cert else None,
        ssl_key=Path(key) if key else None,
    )
    await server.serve()


# --- aiohttp's own server ---------------------------------------------------------------------------------


async def run_aiohttp(port: int, context: ssl.SSLContext | None) -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        body = await request.read() if request.body_exists else b""
        if request.path == "/slow":
            await slow(seconds_of(request.query_string))
            return web.Response(text="done")
        status, out = route(request.method, request.path, len(body))
        return web.Response(status=status, body=out, content_type="text/plain")

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, handler_cancellation=True, keepalive_timeout=30, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024, ssl_context=context).start()
    await asyncio.Event().wait()


# --- bertserve's transport -----------------------------------------------------------------------------


async def run_bertserve(port: int, context: ssl.SSLContext | None) -> None:
    from bertserve.service.http.transport import HttpLimits, HttpServer, Response

    async def handle(request) -> Response:
        if request.path == "/slow":
            await slow(seconds_of(request.query))
            return Response(200, b"done", "text/plain")
        status, out = route(request.method, request.path, len(request.body))
        return Response(status, out, "text/plain")

    limits = HttpLimits(
        max_body_bytes=MAX_BODY,
        max_header_bytes=32768,
        max_connections=1024,
        header_timeout_s=10,
        body_timeout_s=10,
        keep_alive_s=30,
    )
    server = HttpServer(
        handle, limits, lambda status, message: Response(status, message.encode(), "text/plain")
    )
    await server.start("127.0.0.1", port, context)
    await asyncio.Event().wait()


def main() -> None:
    name, port = sys.argv[1], int(sys.argv[2])
    cert, key = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else (None, None)
    context = None
    if cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
    runners = {
        "uvicorn-h11": lambda: run_uvicorn(port, "h11", cert, key),
        "uvicorn-httptools": lambda: run_uvicorn(port, "httptools", cert, key),
        "hypercorn": lambda: run_hypercorn(port, cert, key),
        "granian-embed": lambda: run_granian(port, cert, key),
        "aiohttp": lambda: run_aiohttp(port, context),
        "bertserve": lambda: run_bertserve(port, context),
    }
    asyncio.run(runners[name]())


if __name__ == "__main__":
    main()
