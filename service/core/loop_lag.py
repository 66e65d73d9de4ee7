"""Event-loop lag: how late the loop wakes a timer. Work that holds the loop (building or serializing a
large response, a slow callback) delays every other call on it, health checks included; this measures it.

A task sleeps `interval` seconds and compares when it woke with when it asked to; the difference is time
the loop spent on something else. Exported as `bertserve_event_loop_lag_seconds` (histogram) and
`bertserve_event_loop_lag_max_seconds` (largest over the last `window` samples). The sleep here is the
measurement itself, not a poll for work.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from bertserve.service.metrics import Metrics

INTERVAL_S = 0.05
WINDOW = 200  # samples in the max gauge: 10 s at INTERVAL_S


class LoopLagMonitor:
    def __init__(self, metrics: Metrics, interval_s: float = INTERVAL_S, window: int = WINDOW):
        self.metrics = metrics
        self.interval_s = interval_s
        self.recent: deque[float] = deque(maxlen=window)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="event-loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def max_s(self) -> float:
        return max(self.recent, default=0.0)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, loop.time() - expected)
            self.recent.append(lag)
            self.metrics.event_loop_lag.observe(lag)
            self.metrics.event_loop_lag_max.set(self.max_s)
