"""One server process's life: set up, serve until SIGTERM, SIGINT or SIGHUP, then drain (the whole
server with `workers` 1, or one front of several: service/supervisor/processes.py).

SIGHUP drains too: its default action would kill the server at once, failing the calls in flight (a
terminal closing, or a supervisor that sends it, must not cost answers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from bertserve.service.errors import StartupError
from bertserve.service.memory import limit_heap_growth
from bertserve.service.settings import Settings

if TYPE_CHECKING:
    from bertserve.service.supervisor.server import FrontRole, InferenceServer

log = logging.getLogger("bertserve.server")
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


async def run_until_signalled(
    settings: Settings,
    front: FrontRole | None = None,
    on_ready: Callable[[], None] = lambda: None,
    drain_signals: tuple[signal.Signals, ...] = DRAIN_SIGNALS,
) -> int:
    """Serves until a drain signal; `front`: as one front process of several (service/supervisor/),
    which calls `on_ready` once it serves."""
    from bertserve.service.supervisor.server import InferenceServer

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[signal.Signals] = []

    def on_signal(signum: signal.Signals) -> None:
        received.append(signum)
        stop.set()

    for signum in drain_signals:
        loop.add_signal_handler(signum, on_signal, signum)
    server = InferenceServer(settings, front)
    try:
        if front is None:
            await server.start()
        elif not await _started_unless_stopped(server, stop):
            log.info("signal received while waiting for the engine: stopping")
            await server.stop(finish_queued=False)
            return 0
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        await server.stop(finish_queued=False)
        return 1
    if front is None:
        metrics = f"http://{settings.host}:{server.metrics_port}/metrics" if server.metrics_port else "(off)"
        log.info(
            "serving bertserve.v1.Inference on %s:%d, metrics on %s", settings.host, server.port, metrics
        )
    else:  # the supervisor says when every front serves
        log.info("front %d serving on %s:%d", front.index, settings.host, server.port)
    on_ready()
    await stop.wait()
    log.info("signal received (%s): draining", received[0].name)
    finished = await server.drain()
    log.info("stopped (%s)", "every accepted call answered" if finished else "grace period ran out")
    return 0


def configure_process(settings: Settings, several: bool = False) -> None:
    """What every server process sets first: its log format (naming the process when `several`), how
    its heap gives memory back, and no tokenizer threads."""
    limit_heap_growth()  # freed large requests go back to the kernel (service/memory.py)
    # the tokenizer's own thread pool costs more CPU than it saves on a call's few texts (the CPU pool
    # already spreads large ones), and each front would start one per core; the user's setting wins
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    process = "%(processName)s " if several else ""
    logging.basicConfig(
        level=settings.log_level,
        format=f"%(asctime)s %(levelname)s {process}%(name)s: %(message)s",
        stream=sys.stderr,
    )


async def _started_unless_stopped(server: InferenceServer, stop: asyncio.Event) -> bool:
    """A front's start, given up when a drain signal comes first (the engine it waits for may be gone:
    the supervisor died, and with it the engine)."""
    starting = asyncio.ensure_future(server.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return False
    starting.result()  # its StartupError, if any
    return True
