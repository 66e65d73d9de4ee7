"""Encoder groups: each distinct encoder graph is loaded once and serves every model that runs on it.

Models share a group when their encoder graph for the chosen precision has the same sha256: a head-only
model that names an encoder model, or an older repository whose models hold byte-identical copies. A
group owns the encoder's `instances` (as Triton's instance groups: each runs its own batch on its own
worker thread with `intra_op_threads` threads; on CPU by default all of them run one ONNX session, see
`instance_sessions` in service/settings.py) and one queue owner (`Batcher`):
Embed, FillMask and Classify calls of all its models share batches; `compute` runs the encoder ONCE per
batch, on a free instance, asking only for the outputs the batch's rows need, then each model's head on
that model's rows.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from bertserve.service.engine.batch_metrics import ModelObserver
from bertserve.service.engine.batcher import Batcher, BatchLimits, WorkItem
from bertserve.service.engine.feeds import batch_feeds
from bertserve.service.engine.runtime import CUDA, GraphSession
from bertserve.service.engine.shapes import ShapeBuckets, buckets
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.engine.tasks.fill_mask import mask_positions
from bertserve.service.errors import StartupError
from bertserve.service.thread_names import naming

if TYPE_CHECKING:
    from bertserve.service.engine.model_registry import ModelRegistry
    from bertserve.service.engine.served_model import ServedModel
    from bertserve.service.metrics import Metrics
    from bertserve.service.settings import Settings

log = logging.getLogger("bertserve.engine")
WARM_UP_TEXT = "The server warms up before it reports serving."


class EncoderGroup:
    def __init__(self, name: str, sha256: str, graph_key: str, sessions: list[GraphSession], pad_id: int):
        self.name = name  # the model whose encoder this is (first in order for byte-identical copies)
        self.sha256 = sha256
        self.graph_key = graph_key  # encoder, encoder_int8 or encoder_fp16
        # one per instance (shared: the same session object each time); at most that many batches at once
        self.sessions = sessions
        self.session = sessions[0]
        self._free: queue.SimpleQueue[GraphSession] = queue.SimpleQueue()
        for session in sessions:
            self._free.put(session)
        self.pad_id = pad_id
        self.models: list[ServedModel] = []  # in the server's order
        self.executor = ThreadPoolExecutor(len(sessions), f"bertserve-{name}", naming("bs-compute"))
        self.batcher: Batcher | None = None  # set by the core
        self.buckets: ShapeBuckets | None = None  # batches padded up to these shapes (set with the batcher)
        # seconds of each batch's encoder run alone (set with the batcher): the rest of its compute time is
        # this process's Python around it, waits for the GIL included
        self.run_observed: Callable[[float], None] = lambda seconds: None

    @property
    def instances(self) -> int:
        return len(self.sessions)

    @property
    def provider(self) -> str:
        return self.session.provider

    def compute(self, batch: list[WorkItem]) -> list[object]:
        """Blocking; runs on the group's worker thread. One encoder run for every row of the batch."""
        size, longest = len(batch), max(item.length for item in batch)
        shape = self.buckets.shape(size, longest) if self.buckets else (size, longest)
        captured = self.buckets is not None and self.buckets.holds(shape)  # a CUDA graph where it can be
        feeds = batch_feeds(batch, shape, self.pad_id)  # (B, T) each
        rows: dict[tuple[ServedModel, Task], list[int]] = {}
        for row, item in enumerate(batch):
            model = item.model if item.model is not None else self.models[0]
            rows.setdefault((model, item.options.task), []).append(row)
        # the union of what the rows need: a row's options say which outputs (embed: dense, tokens, sparse)
        needs = dict.fromkeys((item.model or self.models[0], item.options) for item in batch)
        wanted = list(
            dict.fromkeys(name for model, options in needs for name in model.encoder_outputs(options))
        )
        session = self._free.get_nowait()  # never empty: the batcher runs at most `instances` batches at once
        try:
            started = time.perf_counter()
            outputs = session.run(feeds, wanted, captured)
            self.run_observed(time.perf_counter() - started)
        finally:
            self._free.put(session)
        results: list[object] = [None] * size
        for (model, task), task_rows in rows.items():
            model.finish(task, batch, task_rows, outputs, results)
        return results

    def warm_up(self) -> None:
        """Blocking: one batch through every model's heads on each instance, and each attention graph once;
        with shape buckets, then every bucket on each instance. Its runs are not counted as batches' runs."""
        observed, self.run_observed = self.run_observed, lambda seconds: None
        try:
            self._warm_up()
        finally:
            self.run_observed = observed

    def _warm_up(self) -> None:
        items = []
        for model in self.models:
            encoded = model.tokenizer.encode([WARM_UP_TEXT], truncate=True)[0]
            for task in model.tasks:
                ids, positions = encoded.ids, None
                if task is Task.FILL_MASK:
                    ids = ids.copy()
                    ids[1] = model.manifest.tasks.fill_mask.mask_token_id
                    positions = mask_positions(ids, model.manifest.tasks.fill_mask.mask_token_id)
                items.append(
                    WorkItem(ids, encoded.type_ids, TaskOptions(task), None, None, positions, model=model)
                )
            if model.attention is not None:
                model.attention.run(encoded.ids, encoded.type_ids, [0], [0])
        for _ in self.sessions if items else ():
            self.compute(items)  # the free instances are a FIFO queue: each run takes the next instance
        if not (self.buckets and items):
            return
        started, shapes = time.perf_counter(), self.buckets.all()
        tokens = sum(rows * length for rows, length in shapes)
        log.info("encoder %s: warming up %d batch shapes (%d padded tokens)", self.name, len(shapes), tokens)
        # one item per set of outputs the models' tasks ask for by default: with captured runs, each
        # (bucket, set) is captured now, and other sets run plain (service/engine/captured_runs.py)
        capturing = any(getattr(session, "captured", None) is not None for session in self.sessions)
        # ONNX Runtime captures a graph id within its first run; a second replays it, and captures it here
        # too where a version needs a regular run first
        runs = 2 if capturing else 1
        firsts, timings = {}, []
        for item in items if capturing else items[:1]:
            model = item.model or self.models[0]
            firsts.setdefault(frozenset(model.encoder_outputs(item.options)), item)
        for first in firsts.values():  # its text over again, then [SEP] (a fill-mask row's mask stays at 1)
            for size, length in shapes:
                ids = np.resize(first.ids[:-1], length)
                ids[-1] = first.ids[-1]
                zeros = np.zeros(length, np.int64)
                row = WorkItem(ids, zeros, first.options, None, None, first.mask_positions, model=first.model)
                for _ in range(runs * self.instances):
                    begun = time.perf_counter()
                    self.compute([row] * size)
                timings.append((size * length, time.perf_counter() - begun))
        if self.batcher is not None and runs > 1:  # the captured shapes' replays: a first batch cost
            self.batcher.seed_cost(timings)
        self._freeze_captures()
        fit = self.batcher.cost_fit.fit if self.batcher is not None else None
        if fit is not None:
            log.info(
                "encoder %s: a batch costs %.3f ms + %.4f us per padded token",
                self.name,
                1e3 * fit[0],
                1e6 * fit[1],
            )
        log.info(
            "encoder %s: %d batch shapes warmed up on %d instance(s) in %.1fs",
            self.name,
            len(shapes),
            self.instances,
            time.perf_counter() - started,
        )

    def _freeze_captures(self) -> None:
        """No captured run is made after the warm-up; `cuda_graphs` on fails the start where none was."""
        for session in self.sessions:
            captured = getattr(session, "captured", None)
            if captured is not None:
                captured.frozen = True
            if getattr(session, "graphs_required", False) and not captured:
                raise StartupError(f"encoder {self.name}: cuda_graphs on, but no batch shape was captured")


def batch_limits(settings: Settings) -> BatchLimits:
    s = settings
    return BatchLimits(
        s.max_batch_size,
        s.max_batch_tokens,
        s.max_queue_delay_ms / 1000,
        s.max_queue_inputs,
        s.max_padding_ratio,
        s.max_queue_attention,
        s.max_stream_batch_tokens,
    )


def attach_batchers(
    registry: ModelRegistry,
    settings: Settings,
    metrics: Metrics,
    prefetch: int | None = None,
    ahead_when_full: bool = False,
) -> None:
    """One queue owner per encoder, shared by its models and tasks, cutting `prefetch` batches ahead (None:
    the batcher's default), or with 0 and `ahead_when_full` one full batch (service/engine/batcher.py)."""
    limits = batch_limits(settings)
    for group in registry.encoders:
        observer = ModelObserver(metrics, group.name, group.graph_key)
        group.batcher = Batcher(
            group.name, group.compute, limits, group.executor, observer, group.instances, prefetch,
            ahead_when_full,
        )  # fmt: skip
        on = settings.batch_shapes == "buckets" or (
            settings.batch_shapes == "auto" and group.provider == CUDA
        )
        group.run_observed = metrics.encoder_run_duration.labels(group.name).observe
        if not group.models:
            continue
        longest = max(model.manifest.max_length for model in group.models)
        if on:
            group.buckets = buckets(limits.max_batch_size, limits.max_batch_tokens, longest)
            group.batcher.padded_shape = group.buckets.shape
        if settings.batch_cut == "cost" or (settings.batch_cut == "auto" and on):
            steps = group.buckets or buckets(limits.max_batch_size, limits.max_batch_tokens, longest)
            group.batcher.cut_ladders = (steps.rows, steps.lengths)
