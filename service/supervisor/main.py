"""`bertserve serve`: runs the server until SIGTERM, SIGINT or SIGHUP, then drains and exits 0: in this
process (`workers` 1), or as a supervisor of an engine and several fronts."""

from __future__ import annotations

import asyncio
import logging

from bertserve.service.settings import Settings
from bertserve.service.supervisor.scratch import remove_stale
from bertserve.service.supervisor.serving import configure_process, run_until_signalled

log = logging.getLogger("bertserve.server")


def serve(settings: Settings) -> int:
    workers = settings.worker_count()
    configure_process(settings, workers > 1)
    stale = remove_stale()  # folders of runs killed before they removed them (SIGKILL, OOM)
    if stale:
        log.info("removed %d folder(s) of servers that are gone: %s", len(stale), ", ".join(stale))
    if workers > 1:
        from bertserve.service.supervisor.processes import supervise

        return supervise(settings, workers)
    return asyncio.run(run_until_signalled(settings))
