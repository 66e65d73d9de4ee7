"""The batchers' metrics: one encoder's queue depth, drops, queue and inference times, batch sizes and
padding, recorded into the shared `Metrics` (service/metrics.py)."""

from __future__ import annotations

from bertserve.manifest import ENCODER_ATTENTIONS
from bertserve.service.engine.batch_items import BatchObserver, BatchStats
from bertserve.service.metrics import Metrics, observe_each


class ModelObserver(BatchObserver):
    """The queue owner's hooks for one encoder. Its labelled series are looked up once here: the hooks run
    on the event loop several times per batch."""

    def __init__(self, metrics: Metrics, model: str, graph: str):
        self.m, self.model, self.graph = metrics, model, graph
        self._dropped = {r: metrics.dropped.labels(model, r) for r in ("cancelled", "deadline")}  # 0 at start
        self._depth = metrics.queue_depth.labels(model)
        self._last_depth = 0  # what the gauge holds: set again only when it changes
        self._queue = metrics.queue_duration.labels(model)
        self._inference = metrics.inference_duration.labels(model, graph)
        self._size = metrics.batch_size.labels(model)
        self._tokens = metrics.batch_tokens.labels(model)
        self._padding = metrics.padding_ratio.labels(model)
        self._fronts = metrics.batch_fronts.labels(model)

    def queue_depth(self, depth: int) -> None:
        if depth != self._last_depth:
            self._last_depth = depth
            self._depth.set(depth)

    def batch_cost(self, fixed_s: float, token_s: float) -> None:
        self.m.batch_cost.labels(self.model, "fixed").set(fixed_s)
        self.m.batch_cost.labels(self.model, "token").set(token_s)

    def dropped(self, reason: str, count: int) -> None:
        self._dropped[reason].inc(count)

    def batch_done(self, stats: BatchStats) -> None:
        observe_each(self._queue, stats.queue_s)
        if stats.exclusive:  # an attention run: not a batch of the encoder graph
            self.m.inference_duration.labels(self.model, ENCODER_ATTENTIONS).observe(stats.inference_s)
            return
        self._inference.observe(stats.inference_s)
        self._size.observe(stats.size)
        self._tokens.observe(stats.padded_tokens)
        self._padding.observe(stats.padded_tokens / max(1, stats.real_tokens))
        self._fronts.observe(stats.origins)
