"""Attacks by many connections: silent TLS connections, a burst of requests, slowloris."""

from __future__ import annotations

import asyncio
import collections
import statistics

from probes import Monitor, connect, ending, health, now, statuses


async def open_many(port: int, count: int, timeout: float = 3.0, batch: int = 300) -> tuple[list, int]:
    """Opens `count` TCP connections (in batches); returns ([(reader, writer)], failures)."""
    opened, failed = [], 0

    async def one():
        return await connect(port, None, timeout)

    for first in range(0, count, batch):
        for result in await asyncio.gather(
            *(one() for _ in range(min(batch, count - first))), return_exceptions=True
        ):
            if isinstance(result, BaseException):
                failed += 1
            else:
                opened.append(result)
    return opened, failed


# --- issue 30, row 7: silent TCP connections to the TLS port ---------------------------------------------


async def tls_flood(server, count: int = 2100, seconds: float = 24.0) -> dict:
    log_start = server.log_bytes()
    opened, failed = await open_many(server.port, count)
    probes, first_ok, fds_peak, start = collections.Counter(), None, 0, now()
    while now() - start < seconds:
        fds_peak = max(fds_peak, server.ps.num_fds())
        took, status = await health(server.port, server.tls, timeout=3)
        probes[status] += 1
        if took is not None and first_ok is None:
            first_ok = round(now() - start, 1)
        await asyncio.sleep(2)
    closed_by_server = sum(1 for reader, _ in opened if reader.at_eof())
    for _, writer in opened:
        writer.close()
    after = []  # /health over HTTPS 2, 9 and 16 s after the silent connections closed
    for _ in range(3):
        await asyncio.sleep(2)
        after.append((await health(server.port, server.tls, timeout=5))[1])
    log = server.log_text()
    return {
        "silent_connected": len(opened),
        "silent_connect_failed": failed,
        "silent_closed_by_server": closed_by_server,
        "https_probes": dict(probes),
        "first_https_ok_s": first_ok,
        "fds_peak": fds_peak,
        "log_bytes": server.log_bytes() - log_start,
        "log_accept_errors": log.count("accept"),
        "https_after_close": after,
    }


# --- row 10: many connections at once, each with a request ------------------------------------------------


async def burst(server, count: int = 5000, work_s: float = 1.0, timeout: float = 25.0) -> dict:
    request = b"GET /slow?s=%g HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % work_s
    outcomes, monitor, start = collections.Counter(), Monitor(server, interval=1.0), now()

    async def one() -> None:
        try:
            reader, writer = await connect(server.port, None, 15)
        except Exception as exc:
            outcomes[f"connect {ending(exc)}"] += 1
            return
        data = b""
        try:
            writer.write(request)
            data = await asyncio.wait_for(reader.read(4096), max(0.1, timeout - (now() - start)))
            found = statuses(data)
            outcomes[str(found[0]) if found else "closed, no answer"] += 1
        except Exception as exc:
            outcomes[ending(exc)] += 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(count)))
    result = await monitor.stop()
    result["outcomes"] = dict(outcomes)
    result["burst_s"] = round(now() - start, 1)
    stats = await _stats(server)
    result["app_completed"] = stats.get("slow_completed", 0)
    result["app_told_or_cancelled"] = stats.get("slow_told", 0) + stats.get("slow_cancelled", 0)
    return result


async def _stats(server) -> dict:
    from probes import app_stats

    return await app_stats(server)


# --- slowloris: headers trickled one byte a second --------------------------------------------------------


async def slowloris(server, count: int = 1100, seconds: float = 20.0) -> dict:
    opened, failed = await open_many(server.port, count)
    for _, writer in opened:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    monitor, start, trickle = Monitor(server, interval=1.0, timeout=3.0), now(), b"X-Slow: abcdefgh\r\n"
    closed_at: dict[int, float] = {}
    answers: collections.Counter = collections.Counter()
    readers = {i: asyncio.ensure_future(reader.read(4096)) for i, (reader, _) in enumerate(opened)}
    step = 0
    while now() - start < seconds:
        for i, (_, writer) in enumerate(opened):
            if i in closed_at:
                continue
            if readers[i].done():
                closed_at[i] = now() - start
                error = readers[i].exception()
                found = statuses(readers[i].result()) if error is None else []
                answers[str(found[0]) if found else ("closed" if error is None else ending(error))] += 1
                continue
            writer.write(trickle[step % len(trickle) : step % len(trickle) + 1])
        step += 1
        await asyncio.sleep(1)
    result = await monitor.stop()
    for task in readers.values():
        task.cancel()
    for _, writer in opened:
        writer.close()
    times = sorted(closed_at.values())
    result |= {
        "slow_connected": len(opened),
        "slow_connect_failed": failed,
        "slow_closed_by_server": len(times),
        "slow_close_median_s": round(statistics.median(times), 1) if times else None,
        "slow_answers": dict(answers),
    }
    return result
