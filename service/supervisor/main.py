"""`bertserve serve`: runs the server until SIGTERM, SIGINT or SIGHUP, then drains and exits 0.

SIGHUP drains too: its default action would kill the server at once, failing the calls in flight (a
terminal closing, or a supervisor that sends it, must not cost answers)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from bertserve.service.errors import StartupError
from bertserve.service.memory import limit_heap_growth
from bertserve.service.settings import Settings

log = logging.getLogger("bertserve.server")
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


async def run_until_signalled(settings: Settings) -> int:
    from bertserve.service.supervisor.server import InferenceServer

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[signal.Signals] = []

    def on_signal(signum: signal.Signals) -> None:
        received.append(signum)
        stop.set()

    for signum in DRAIN_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    server = InferenceServer(settings)
    try:
        await server.start()
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        await server.stop(finish_queued=False)
        return 1
    log.info(
        "serving bertserve.v1.Inference on %s:%d, metrics on %s",
        settings.host,
        server.port,
        f"http://{settings.host}:{server.metrics_port}/metrics" if server.metrics_port else "(off)",
    )
    await stop.wait()
    log.info("signal received (%s): draining", received[0].name)
    finished = await server.drain()
    log.info("stopped (%s)", "every accepted call answered" if finished else "grace period ran out")
    return 0


def serve(settings: Settings) -> int:
    limit_heap_growth()  # freed large requests go back to the kernel (service/memory.py)
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return asyncio.run(run_until_signalled(settings))
