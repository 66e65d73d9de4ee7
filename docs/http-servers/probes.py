"""The attacks of attacks.py: each takes a started `Server` and returns a dict of what happened."""

from __future__ import annotations

import asyncio
import collections
import json
import re
import statistics
import time

MiB = 1024 * 1024
STATUS = re.compile(rb"(?:^|\r\n)HTTP/1\.[01] (\d{3})")
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def now() -> float:
    return time.monotonic()


def statuses(data: bytes) -> list[int]:
    return [int(s) for s in STATUS.findall(data)]


async def connect(port: int, tls=None, timeout: float = 5.0):
    return await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=tls, server_hostname="localhost" if tls else None),
        timeout,
    )


def ending(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionResetError):
        return "reset"
    return type(exc).__name__


async def raw(port: int, data: bytes, tls=None, timeout: float = 5.0) -> tuple[bytes, str]:
    """Sends `data`, reads until the server closes or `timeout`; returns (bytes read, how it ended)."""
    try:
        reader, writer = await connect(port, tls, timeout)
    except Exception as exc:
        return b"", f"connect: {ending(exc)}"
    got, end, deadline = bytearray(), "closed", now() + timeout
    try:
        writer.write(data)
        await asyncio.wait_for(writer.drain(), timeout)
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), max(0.01, deadline - now()))
            if not chunk:
                break
            got += chunk
    except Exception as exc:
        end = ending(exc)
    finally:
        writer.close()
    return bytes(got), end


def outcome(data: bytes, end: str) -> str:
    found = statuses(data)
    return ",".join(map(str, found)) if found else f"no answer ({end})"


async def health(port: int, tls=None, timeout: float = 5.0) -> tuple[float | None, str]:
    """GET /health on a new connection: (seconds when 200, else None; the status or how it failed)."""
    start = now()
    data, end = await raw(port, HEALTH, tls, timeout)
    found = statuses(data)
    if found[:1] == [200]:
        return now() - start, "200"
    return None, str(found[0]) if found else end


class Monitor:
    """While an attack runs: /health every `interval`, the server's RSS and open descriptors."""

    def __init__(self, server, interval: float = 0.5, timeout: float = 5.0, tls=None):
        self.server, self.interval, self.timeout, self.tls = server, interval, timeout, tls
        self.latencies: list[float] = []
        self.failures: collections.Counter = collections.Counter()
        self.rss_peak = self.fds_peak = 0
        self.rss_start = server.rss_mb()
        self.tasks = [asyncio.ensure_future(self._probe()), asyncio.ensure_future(self._sample())]

    async def _probe(self) -> None:
        while True:
            seconds, status = await health(self.server.port, self.tls, self.timeout)
            if seconds is None:
                self.failures[status] += 1
            else:
                self.latencies.append(seconds)
            await asyncio.sleep(self.interval)

    async def _sample(self) -> None:
        while True:
            try:
                self.rss_peak = max(self.rss_peak, self.server.rss_mb())
                self.fds_peak = max(self.fds_peak, self.server.ps.num_fds())
            except Exception:
                return
            await asyncio.sleep(0.25)

    async def stop(self) -> dict:
        if not self.latencies and not self.failures:  # the attack ended before the first probe did
            await asyncio.wait([self.tasks[0]], timeout=self.timeout + 1)
        for task in self.tasks:
            task.cancel()
        ms = sorted(1000 * s for s in self.latencies)
        return {
            "rss_start_mb": self.rss_start,
            "rss_peak_mb": self.rss_peak,
            "fds_peak": self.fds_peak,
            "health_ok": len(ms),
            "health_failed": dict(self.failures),
            "health_p50_ms": round(statistics.median(ms), 1) if ms else None,
            "health_max_ms": round(ms[-1], 1) if ms else None,
        }


async def app_stats(server) -> dict:
    data, _ = await raw(
        server.port, b"GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", server.tls
    )
    return json.loads(data.split(b"\r\n\r\n", 1)[1] or b"{}") if b"\r\n\r\n" in data else {}


# --- issue 30, row 1: a header value that never ends -----------------------------------------------------


async def endless_header(server, conns: int = 8, seconds: float = 12.0) -> dict:
    monitor, start, chunk = Monitor(server), now(), b"a" * 65536
    writers, answers = [], []

    async def one() -> None:
        reader, writer = await connect(server.port)
        writers.append(writer)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nX-Long: ")
        first = asyncio.ensure_future(reader.read(4096))
        while now() - start < seconds and not first.done() and not writer.is_closing():
            if writer.transport.get_write_buffer_size() < MiB:  # the harness buffers at most 1 MiB
                writer.write(chunk)
            await asyncio.sleep(0.005)
        await asyncio.wait([first], timeout=0.5)
        if first.done() and first.exception() is None:
            answers.append((round(now() - start, 2), outcome(first.result(), "closed")))
        elif first.done():
            answers.append((round(now() - start, 2), ending(first.exception())))
        else:
            first.cancel()
            answers.append((None, "no answer in time"))

    await asyncio.gather(*(one() for _ in range(conns)), return_exceptions=True)
    result = await monitor.stop()
    result["rss_end_mb"] = server.rss_mb()
    for writer in writers:
        writer.close()
    await asyncio.sleep(3)
    result["rss_3s_after_close_mb"] = server.rss_mb()
    times = [t for t, _ in answers if t is not None]
    result["first_answer_s"] = min(times) if times else None
    result["answers"] = dict(collections.Counter(a for _, a in answers))
    return result


# --- row 2: bodies one byte short of their Content-Length, then close ------------------------------------


async def short_bodies(server, rounds: int = 3, bodies: int = 80, concurrency: int = 16) -> dict:
    body = memoryview(bytes(8 * MiB - 1))
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (8 * MiB)
    gate, errors, after_round = asyncio.Semaphore(concurrency), collections.Counter(), []
    rss_start = server.rss_mb()

    async def one() -> None:
        async with gate:
            try:
                _, writer = await connect(server.port)
            except Exception as exc:
                errors[f"connect: {ending(exc)}"] += 1
                return
            try:
                writer.write(head)
                for offset in range(0, len(body), 256 * 1024):
                    writer.write(body[offset : offset + 256 * 1024])
                    await asyncio.wait_for(writer.drain(), 10)
                await asyncio.sleep(0.3)  # the server reads the last bytes
            except Exception as exc:
                errors[ending(exc)] += 1
            finally:
                writer.close()

    for _ in range(rounds):
        await asyncio.gather(*(one() for _ in range(bodies)))
        await asyncio.sleep(1)
        after_round.append(server.rss_mb())
    await asyncio.sleep(3)
    seconds, status = await health(server.port)
    return {
        "rss_start_mb": rss_start,
        "rss_after_each_round_mb": after_round,
        "rss_4s_after_last_mb": server.rss_mb(),
        "send_errors": dict(errors),
        "health_after": status,
    }


# --- row 5: the client leaves while its request is being answered ----------------------------------------


async def client_close(server, requests: int = 4, work_s: float = 3.0) -> dict:
    before = await app_stats(server)
    request = b"POST /slow?s=%g HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello" % work_s

    async def one() -> None:
        _, writer = await connect(server.port)
        writer.write(request)
        await asyncio.sleep(0.3)
        writer.close()

    await asyncio.gather(*(one() for _ in range(requests)))
    await asyncio.sleep(work_s + 1)
    after = await app_stats(server)
    keys = ["slow_told", "slow_cancelled", "slow_completed", "disconnect_in_body"]
    return {"requests": requests} | {k: after.get(k, 0) - before.get(k, 0) for k in keys}
