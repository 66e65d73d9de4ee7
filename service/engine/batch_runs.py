"""A batcher's batches and exclusive jobs on the encoder's worker threads (service/engine/batcher.py cuts them).

Each run is timed on the worker; a batch computes only the inputs still wanted when it starts (one cut ahead
waited for an instance, its callers may have left), measures its cost (the batcher's wait estimates and its
cut by cost read it), answers each input's future on the event loop and reports its stats. A run that fails
fails its inputs' futures; one cancelled at the end of the grace period fails them with ShuttingDown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from bertserve.service.engine.batch_items import BatchObserver, BatchStats, ExclusiveJob, ItemResult, WorkItem
from bertserve.service.engine.batch_policy import BatchCostFit, CostEstimate
from bertserve.service.errors import DeadlineTooShort, InferenceFailed, ShuttingDown

log = logging.getLogger(__name__)

# A call ended this close to its deadline is counted as expired rather than cancelled: a client's cancel at
# its deadline reaches the server early by as long as the server took to read the call's headers (under
# load, more than 50 ms), and the client saw DEADLINE_EXCEEDED. The native transport uses the same slack.
DEADLINE_SLACK_S = 0.25

Shape = Callable[[int, int], tuple[int, int]]


def _timed(fn: Callable[..., Any], *args) -> tuple[Any, float, float]:
    """Runs in the worker: (result, start in time.monotonic(), seconds of compute)."""
    started = time.monotonic()
    value = fn(*args)
    return value, started, time.monotonic() - started


def _run_live(compute: Callable[[list[WorkItem]], list[Any]], batch: list[WorkItem]):
    """Runs in the worker: computes the batch's inputs that are still wanted when it starts (a batch cut
    ahead waited for an instance; its callers may have left). ((indices computed, their values), start in
    time.monotonic(), seconds of compute). Reading `future.done()` here is safe: a future only ever goes
    from pending to done, so an input seen as wanted costs at most a wasted row."""
    started = time.monotonic()
    live = [
        i
        for i, item in enumerate(batch)
        if not item.future.done() and (item.deadline is None or item.deadline > started)
    ]
    values = compute([batch[i] for i in live]) if live else []
    return (live, values), started, time.monotonic() - started


def classify_dead(waiting: list, now: float) -> tuple[list, list, list]:
    """(live, cancelled, expired) of queued inputs or jobs; an expired one still pending is failed here."""
    live, cancelled, expired = [], [], []
    for one in waiting:
        if one.future.done():  # the caller went away: it cancelled, or gRPC ended it at its deadline
            near_deadline = one.deadline is not None and one.deadline <= now + DEADLINE_SLACK_S
            (expired if near_deadline else cancelled).append(one)
        elif one.deadline is not None and one.deadline <= now:
            expired.append(one)
            one.future.set_exception(DeadlineTooShort("the deadline passed while the input was queued"))
        else:
            live.append(one)
    return live, cancelled, expired


def count_dropped(observer: BatchObserver, cancelled: list, expired: list) -> None:
    for reason, dropped in (("cancelled", cancelled), ("deadline", expired)):
        if dropped:
            observer.dropped(reason, len(dropped))


class BatchRuns:
    """The runs of one batcher: `batch` and `exclusive` each await one run on `executor`. Batches and jobs are
    numbered together (`ItemResult.batch_id`)."""

    def __init__(
        self,
        name: str,
        compute: Callable[[list[WorkItem]], list[Any]],
        executor: Executor,
        observer: BatchObserver,
    ):
        self.name = name
        self.compute = compute  # blocking, on the worker: the encoder group's compute (tests wrap it)
        self._executor = executor
        self._observer = observer
        self._count = 0
        self.cost = CostEstimate()  # recent seconds per padded token
        self.cost_fit = BatchCostFit()  # fixed cost + per padded token, fitted where batches are cut by cost

    async def batch(self, batch: list[WorkItem], padded_shape: Shape, fit_line: bool) -> None:
        """Runs `batch`, computed at `padded_shape(rows, length)`; `fit_line`: its time also refits `cost_fit`."""
        self._count += 1
        batch_id = self._count
        timed = await self._in_worker(batch, _run_live, self.compute, batch)
        if timed is None:
            return
        (live, values), started, inference_s = timed
        if len(live) < len(batch):  # its callers left while it waited for an instance: count them
            computed = set(live)
            _, cancelled, expired = classify_dead(
                [item for i, item in enumerate(batch) if i not in computed], time.monotonic()
            )
            count_dropped(self._observer, cancelled, expired)
            batch = [batch[i] for i in live]
            if not batch:
                return
        rows, length = padded_shape(len(batch), max(item.length for item in batch))
        padded = rows * length
        self.cost.add(inference_s, padded)
        if fit_line:
            line = self.cost_fit.fit
            self.cost_fit.add(inference_s, padded)
            if self.cost_fit.fit is not line:
                self._observer.batch_cost(*self.cost_fit.fit)
        queue_s = [max(0.0, started - item.enqueued_at) for item in batch]
        for item, value, waited in zip(batch, values, queue_s, strict=True):
            if not item.future.done():
                item.future.set_result(ItemResult(value, waited, inference_s, batch_id))
        origins = len({item.origin for item in batch})
        real = sum(item.length for item in batch)
        self._observer.batch_done(BatchStats(len(batch), padded, real, queue_s, inference_s, origins=origins))

    async def exclusive(self, job: ExclusiveJob) -> None:
        """Runs `job` alone (the batcher runs it when no batch computes), unless its caller left meanwhile."""
        _, cancelled, expired = classify_dead([job], time.monotonic())
        if cancelled or expired:  # its caller left since the queue was last read through
            count_dropped(self._observer, cancelled, expired)
            return
        self._count += 1
        batch_id = self._count
        timed = await self._in_worker([job], _timed, job.run)
        if timed is None:
            return
        value, started, inference_s = timed
        waited = max(0.0, started - job.enqueued_at)
        if not job.future.done():
            job.future.set_result(ItemResult(value, waited, inference_s, batch_id))
        self._observer.batch_done(
            BatchStats(1, job.tokens, job.tokens, [waited], inference_s, exclusive=True)
        )

    async def _in_worker(
        self, waiting: list, run: Callable[..., Any], *args
    ) -> tuple[Any, float, float] | None:
        """`run(*args)` on the worker (`_timed` or `_run_live`: (value, start, seconds)); None when it
        failed (the futures are failed)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, run, *args)
        except asyncio.CancelledError:  # abort(): the grace period is over
            for one in waiting:
                if not one.future.done():
                    one.future.set_exception(ShuttingDown(f"model {self.name}: the server stopped"))
            raise
        except Exception as exc:
            log.exception("model %s: a run of %d inputs failed", self.name, len(waiting))
            error = exc if isinstance(exc, InferenceFailed) else None
            for one in waiting:
                if not one.future.done():
                    one.future.set_exception(
                        error or InferenceFailed(f"model {self.name}: inference failed: {exc}")
                    )
            return None
