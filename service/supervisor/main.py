"""`bertserve serve`: runs the server until SIGTERM, SIGINT or SIGHUP, then drains and exits 0: in this
process (`workers` 1), or as a supervisor of an engine and several fronts."""

from __future__ import annotations

import asyncio

from bertserve.service.settings import Settings
from bertserve.service.supervisor.serving import configure_process, run_until_signalled


def serve(settings: Settings) -> int:
    workers = settings.worker_count()
    configure_process(settings, workers > 1)
    if workers > 1:
        from bertserve.service.supervisor.processes import supervise

        return supervise(settings, workers)
    return asyncio.run(run_until_signalled(settings))
