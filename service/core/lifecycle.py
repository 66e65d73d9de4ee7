"""Whether the server accepts new calls and how many are in flight: shared by every front (gRPC, HTTP,
KServe), so the drain waits for all of them."""

from __future__ import annotations

import asyncio


class Lifecycle:
    """Whether new calls are accepted, and how many are in flight (the drain waits for zero)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = asyncio.Event()  # set once new calls are refused (streams stop admitting then)
        self._closing = asyncio.Event()  # set when the grace period is over: open streams end at once

    @property
    def accepting(self) -> bool:
        return not self._draining.is_set()

    @accepting.setter
    def accepting(self, value: bool) -> None:
        if value:
            self._draining.clear()
        else:
            self._draining.set()

    async def wait_draining(self) -> None:
        """Returns once new calls are refused (`accepting` set to False)."""
        await self._draining.wait()

    def close(self) -> None:
        """The grace period is over: streams still open end now (with UNAVAILABLE)."""
        self._closing.set()

    async def wait_closing(self) -> None:
        await self._closing.wait()

    def enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
