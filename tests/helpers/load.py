"""Load for the hardening tests: a closed loop (N callers back to back) and an open loop (calls started on a
fixed schedule, whatever the server does), each call's status code and latency recorded; and the RSS of a
server process sampled in the background with psutil.

Open-loop latency counts from the scheduled start, so a client that falls behind is not hidden
(no coordinated omission). All traffic goes to the address given (tests use 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
import psutil

Call = Callable[[int], Awaitable[object]]  # sends the k-th request, returns the reply


@dataclass(frozen=True)
class Outcome:
    started: float  # perf_counter seconds: the scheduled start (open loop) or the send (closed loop)
    latency_s: float
    code: str  # grpc.StatusCode name
    reply: object = None


@dataclass
class LoadResult:
    seconds: float  # from the first start to the last answer
    outcomes: list[Outcome] = field(default_factory=list)

    def codes(self) -> Counter:
        return Counter(o.code for o in self.outcomes)

    def latencies(self, code: str = "OK") -> list[float]:
        return [o.latency_s for o in self.outcomes if o.code == code]

    def rate(self, code: str | None = None) -> float:
        """Calls per second (of one status code, or all)."""
        count = len(self.outcomes) if code is None else self.codes()[code]
        return count / self.seconds


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


async def _timed(call: Call, k: int, started: float) -> Outcome:
    try:
        reply = await call(k)
    except grpc.aio.AioRpcError as error:
        return Outcome(started, time.perf_counter() - started, error.code().name)
    return Outcome(started, time.perf_counter() - started, "OK", reply)


async def closed_loop(call: Call, concurrency: int, seconds: float) -> LoadResult:
    """`concurrency` callers, each starting its next call when its last one is answered, for `seconds`."""
    begin = time.perf_counter()
    stop_at = begin + seconds
    counter = iter(range(1 << 62))
    outcomes: list[Outcome] = []

    async def caller() -> None:
        while time.perf_counter() < stop_at:
            outcomes.append(await _timed(call, next(counter), time.perf_counter()))

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return LoadResult(time.perf_counter() - begin, outcomes)


async def open_loop(call: Call, rate: float, seconds: float) -> LoadResult:
    """round(rate x seconds) calls started at evenly spaced times (the event loop's timer starts each one,
    no polling); waits until every call is answered."""
    loop = asyncio.get_running_loop()
    count = max(1, round(rate * seconds))
    tasks: list[asyncio.Task] = []
    all_started = loop.create_future()
    begin_loop, begin = loop.time() + 0.05, time.perf_counter() + 0.05

    def start(k: int) -> None:
        tasks.append(loop.create_task(_timed(call, k, begin + k / rate)))
        if len(tasks) == count:
            all_started.set_result(None)

    for k in range(count):
        loop.call_at(begin_loop + k / rate, start, k)
    await all_started
    outcomes = await asyncio.gather(*tasks)
    return LoadResult(time.perf_counter() - begin, list(outcomes))


class RssSampler:
    """Samples a process's resident set size every `interval_s` in a background thread."""

    def __init__(self, pid: int, interval_s: float = 0.5):
        self.process = psutil.Process(pid)
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []  # (perf_counter seconds, bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append((time.perf_counter(), self.process.memory_info().rss))
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def between(self, start: float, end: float = math.inf) -> list[int]:
        return [rss for at, rss in self.samples if start <= at <= end]
