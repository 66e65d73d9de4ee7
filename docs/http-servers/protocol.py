"""Single-connection attacks (odd requests: what status comes back) and the CPU cost of plain requests."""

from __future__ import annotations

import asyncio
import statistics

from probes import app_stats, connect, now, outcome, raw, statuses

H = b"Host: x\r\nConnection: close\r\n"


# --- issue 30, row 9: absolute-form URLs ------------------------------------------------------------------


async def absolute_form(server) -> dict:
    requests = {
        "CONNECT 127.0.0.1:22": b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n",
        "GET http://[::1": b"GET http://[::1 HTTP/1.1\r\n" + H + b"\r\n",
        "GET http://127.0.0.1/health": b"GET http://127.0.0.1/health HTTP/1.1\r\n" + H + b"\r\n",
    }
    return {name: outcome(*await raw(server.port, data, timeout=3)) for name, data in requests.items()}


# --- the earlier hostile list ---------------------------------------------------------------------------


async def protocol(server) -> dict:
    p, result = server.port, {}

    async def ask(name: str, data: bytes, timeout: float = 5.0) -> bytes:
        got, end = await raw(p, data, timeout=timeout)
        result[name] = outcome(got, end)
        return got

    await ask("header 40 KiB", b"GET /health HTTP/1.1\r\n" + H + b"X-Big: " + b"a" * 40960 + b"\r\n\r\n")
    await ask("header 1 MiB", b"GET /health HTTP/1.1\r\n" + H + b"X-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
    many = b"".join(b"X-%d: v\r\n" % i for i in range(200))
    await ask("200 headers", b"GET /health HTTP/1.1\r\n" + H + many + b"\r\n")
    await ask("URL 64 KiB", b"GET /health?" + b"a" * 65536 + b" HTTP/1.1\r\n" + H + b"\r\n")
    # smuggling: the tail is a second request to /smuggled if the body ends where chunking says
    tail = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    chunked = b"0\r\n\r\n" + tail
    await ask(
        "CL+TE",
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % 5
        + chunked,
        3,
    )
    await ask(
        "CL+CL differing",
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 41\r\n\r\nhello" + tail,
        3,
    )
    await ask(
        "TE with space before colon + CL",
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding : chunked\r\n\r\n"
        + chunked,
        3,
    )
    await ask(
        "TE: chunked, identity",
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n" + chunked,
        3,
    )
    result["smuggled requests reached the app"] = (await app_stats(server)).get("smuggled", 0)
    pipelined = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 3
    pipelined += b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
    pipelined += b"GET /health HTTP/1.1\r\n" + H + b"\r\n"
    got = await ask("pipelined 5", pipelined)
    result["pipelined 5"] += " in order" if b"\r\n\r\n5HTTP" in got else " (echo body not 4th)"
    await ask(
        "Expect: 200-ok", b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 5\r\nExpect: 200-ok\r\n\r\nhello"
    )
    result["Expect: 100-continue"] = await continue_100(p)
    got = await ask("HEAD /health", b"HEAD /health HTTP/1.1\r\n" + H + b"\r\n")
    result["HEAD body bytes sent"] = len(got.split(b"\r\n\r\n", 1)[1]) if b"\r\n\r\n" in got else None
    return result


async def continue_100(port: int) -> str:
    reader, writer = await connect(port)
    try:
        writer.write(b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        try:
            first = await asyncio.wait_for(reader.read(4096), 2)
        except TimeoutError:
            first = b""
        writer.write(b"hello")
        rest = await asyncio.wait_for(reader.read(4096), 3) if b" 100 " in first or not first else b""
        return ",".join(map(str, statuses(first + rest))) or "no answer"
    except Exception as exc:
        return type(exc).__name__
    finally:
        writer.close()


async def plain_to_tls(server) -> dict:
    got, end = await raw(server.port, b"GET /health HTTP/1.1\r\n" + H + b"\r\n", timeout=12)
    return {"answer": outcome(got, end), "first bytes": got[:40].decode("latin-1")}


# --- CPU per request at a fixed modest load ---------------------------------------------------------------


async def read_response(reader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return statuses(head)[0]


async def cpu(server, conns: int = 4, rate: float = 200.0, seconds: float = 10.0) -> dict:
    idle0 = server.cpu_s()
    await asyncio.sleep(2)
    idle_ms_per_s = (server.cpu_s() - idle0) * 1000 / 2
    requests = [
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\n\r\n" + b"a" * 1024,
    ]
    latencies, bad = [], 0
    cpu0, start = server.cpu_s(), now()

    async def one(index: int) -> None:
        nonlocal bad
        reader, writer = await connect(server.port)
        interval, k = conns / rate, 0
        while now() - start < seconds:
            due = start + index * interval / conns + k * interval
            await asyncio.sleep(max(0.0, due - now()))
            sent = now()
            writer.write(requests[k % 2])
            if await read_response(reader) != 200:
                bad += 1
            latencies.append(now() - sent)
            k += 1
        writer.close()

    await asyncio.gather(*(one(i) for i in range(conns)))
    used_ms = (server.cpu_s() - cpu0) * 1000
    return {
        "requests": len(latencies),
        "non_200": bad,
        "server_cpu_ms_per_request": round(used_ms / len(latencies), 3),
        "idle_cpu_ms_per_s": round(idle_ms_per_s, 2),
        "latency_p50_ms": round(1000 * statistics.median(latencies), 2),
        "achieved_rps": round(len(latencies) / (now() - start), 1),
    }
