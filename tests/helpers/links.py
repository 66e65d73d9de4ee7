"""Two ends of a real FrameLink over a socket pair, and a bounded wait, for the link's tests."""

from __future__ import annotations

import asyncio
import socket
import time

from bertserve.service.engine.frame_link import FrameLink


async def linked() -> tuple[FrameLink, list]:
    """An engine-side link whose peer records every message it receives."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    received: list = []
    await loop.create_unix_connection(
        lambda: FrameLink(lambda _, m: received.append(m), lambda e: None), sock=theirs
    )
    _, link = await loop.create_unix_connection(
        lambda: FrameLink(lambda _, m: None, lambda e: None), sock=ours
    )
    return link, received


async def until(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "never reached"
        await asyncio.sleep(0.005)


def none_failed(items, error):
    raise AssertionError(f"no build should fail here: {error!r}")
