"""Prometheus metrics (listed in the README's Monitor table), in a registry of their own per server, with the
standard process_*, python_* and python_gc_* collectors, served over HTTP on their own port by the
bounded server of service/metrics_http.py.

With several processes (`Metrics(multiprocess=True)` in each child) the values live in prometheus_client's
multiprocess files and the supervisor serves one aggregated scrape (service/metrics_multiprocess.py). Every
Gauge names how its per-process values combine; a single process ignores that, so N == 1 is unchanged.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from bertserve.service.metrics_http import MetricsHTTPServer
from bertserve.service.metrics_multiprocess import require_multiprocess_mode

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
FRONT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
RATIO_BUCKETS = (1.0, 1.05, 1.1, 1.25, 1.5, 2, 3, 5, 10)


def observe_each(histogram, values: Sequence[float]) -> None:
    """`histogram.observe(v)` for each of `values`, in one write per bucket touched and one for the sum:
    the queue owner records every input's wait once per batch, and in multiprocess mode each observe is
    two writes to the metrics file. prometheus_client has no such call; this reads its Histogram's own
    fields (`_upper_bounds`, `_buckets`, `_sum`), and a test holds it to `observe`'s exposition."""
    if not values:
        return
    counts = collections.Counter(bisect.bisect_left(histogram._upper_bounds, value) for value in values)
    for index, count in counts.items():
        histogram._buckets[index].inc(count)
    histogram._sum.inc(sum(values))


class Metrics:
    def __init__(self, multiprocess: bool = False) -> None:
        """`multiprocess`: a child of `serve --workers N`; PROMETHEUS_MULTIPROC_DIR must have been in this
        process's environment when it first imported prometheus_client (raises RuntimeError otherwise)."""
        self.multiprocess = multiprocess
        if multiprocess:
            require_multiprocess_mode()
        self.registry = CollectorRegistry()
        r = self.registry
        if not multiprocess:
            # process_* (CPU, resident memory, open fds, start time), python_info, python_gc_*: what the
            # default registry has, which a registry of our own leaves out. With several processes the
            # supervisor reads every child's process_* from /proc (service/metrics_multiprocess.py).
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        self.requests = Counter("bertserve_requests", "RPCs answered", ["rpc", "code"], registry=r)
        self.request_duration = Histogram(
            "bertserve_request_duration_seconds", "RPC duration", ["rpc"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_duration = Histogram(
            "bertserve_queue_duration_seconds",
            "time an input waited in its model's queue",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_duration = Histogram(
            "bertserve_inference_duration_seconds",
            "compute time of one batch",
            ["model", "graph"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.encoder_run_duration = Histogram(
            "bertserve_encoder_run_duration_seconds",
            "ONNX Runtime's run of one encoder batch, within the batch's compute time",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "bertserve_batch_size", "inputs per batch", ["model"], buckets=SIZE_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "bertserve_batch_tokens", "padded tokens per batch", ["model"], buckets=TOKEN_BUCKETS, registry=r
        )
        self.batch_fronts = Histogram(
            "bertserve_batch_fronts",
            "front processes whose inputs share a batch (1 with workers 1)",
            ["model"],
            buckets=FRONT_BUCKETS,
            registry=r,
        )
        self.padding_ratio = Histogram(
            "bertserve_padding_ratio",
            "padded tokens / real tokens per batch",
            ["model"],
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        # `model` on batch-level metrics (queue, inference, batch_*, padding, queue_depth, dropped) names the
        # ENCODER whose queue owner ran them (the model that holds the encoder graph): models that share
        # an encoder share its batches. inputs_total and model_info name the model a call asked for.
        self.queue_depth = Gauge(
            "bertserve_queue_depth",
            "inputs queued (batch inputs and attention calls); with several engines, the fullest one's",
            ["model"],
            registry=r,
            # set by the queue owners (the engines) only, the fronts' series stay 0; gone with the engine. The
            # fullest engine's, as max_queue_inputs bounds each engine's queue (alerts compare the two)
            multiprocess_mode="livemax",
        )
        self.batch_cost = Gauge(
            "bertserve_batch_cost_seconds",
            "the line batches are cut by (batch_cut cost): seconds per batch (term fixed) and per padded "
            "token (term token)",
            ["model", "term"],
            registry=r,
            multiprocess_mode="livemax",  # set by the queue owner (the engine) only
        )
        self.event_loop_lag = Histogram(
            "bertserve_event_loop_lag_seconds",
            "how late the event loop woke a timer (service/core/loop_lag.py): time the loop was busy",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.event_loop_lag_max = Gauge(
            "bertserve_event_loop_lag_max_seconds",
            "largest event loop lag over the last window (see bertserve_event_loop_lag_seconds)",
            registry=r,
            # the worst live loop: the same series as one process (no pid label) and what delays calls
            multiprocess_mode="livemax",
        )
        self.inputs = Counter("bertserve_inputs", "inputs accepted", ["model", "task"], registry=r)
        # work done on inputs: only calls that were admitted (room in the queue taken) are tokenized
        self.tokenized = Counter(
            "bertserve_tokenized_inputs", "inputs tokenized (admitted calls only)", ["model"], registry=r
        )
        # EmbedStream (service/grpc/streaming.py): requests_total{rpc="EmbedStream"} counts streams by final code
        self.streams_open = Gauge(
            "bertserve_streams_open", "EmbedStream calls in progress", registry=r, multiprocess_mode="livesum"
        )
        self.stream_inputs_in_flight = Histogram(
            "bertserve_stream_inputs_in_flight",
            "a stream's inputs in flight (admitted, not yet answered and sent), observed at each admission",
            buckets=SIZE_BUCKETS + (1024, 4096),
            registry=r,
        )
        self.stream_requests = Counter(
            "bertserve_stream_requests",
            "EmbedStream requests (stream messages) answered",
            ["code"],
            registry=r,
        )
        self.dropped = Counter(
            "bertserve_dropped", "inputs dropped before compute", ["model", "reason"], registry=r
        )
        # the HTTP transport (service/http/connections.py): refusals before any request is routed
        self.http_connections = Counter(
            "bertserve_http_connections",
            "HTTP connections by outcome: accepted, refused (over http_max_connections), evicted (idle "
            "keep-alive closed for a new one), handshake_failed, handshake_timeout, not_tls (plain HTTP "
            "to the HTTPS port), unread (closed while its client had not taken a reply, over "
            "http_max_reply_bytes_in_flight)",
            ["outcome"],
            registry=r,
        )
        self.http_connections_open = Gauge(
            "bertserve_http_connections_open",
            "HTTP connections open (TLS handshakes included)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.http_rejected = Counter(
            "bertserve_http_rejected",
            "HTTP requests refused by the transport before routing, by status (408: timed out)",
            ["status"],
            registry=r,
        )
        self.model_info = Gauge(
            "bertserve_model_info",
            "loaded models",
            ["model", "version", "precision", "provider", "tasks"],
            registry=r,
            # 1 however many processes load the model; gone with the last of them
            multiprocess_mode="livemax",
        )
        self.limit = Gauge(
            "bertserve_limit",
            "configured limits: the settings max_* by name (alerts compare queue_depth with max_queue_inputs)",
            ["name"],
            registry=r,
            # every process exports the same settings: one value, kept while the server runs
            multiprocess_mode="max",
        )
        self._http: MetricsHTTPServer | None = None
        # labelled series of the per-call metrics, looked up once per label set (see answered, inputs_of)
        self._answered: dict[tuple[str, str], tuple] = {}
        self._inputs: dict[tuple[str, str], Counter] = {}
        self._tokenized: dict[str, Counter] = {}

    def answered(self, rpc: str, code: str, seconds: float) -> None:
        """One call of `rpc` answered with `code` after `seconds` (the labelled series looked up once)."""
        series = self._answered.get((rpc, code))
        if series is None:
            series = self._answered[rpc, code] = (
                self.requests.labels(rpc, code),
                self.request_duration.labels(rpc),
            )
        series[0].inc()
        series[1].observe(seconds)

    def inputs_of(self, model: str, task: str) -> Counter:
        """bertserve_inputs_total{model, task}, looked up once per pair."""
        series = self._inputs.get((model, task))
        if series is None:
            series = self._inputs[model, task] = self.inputs.labels(model, task)
        return series

    def tokenized_of(self, model: str) -> Counter:
        """bertserve_tokenized_inputs_total{model}, looked up once per model."""
        series = self._tokenized.get(model)
        if series is None:
            series = self._tokenized[model] = self.tokenized.labels(model)
        return series

    def export_limits(self, settings) -> None:
        """bertserve_limit{name} for every `max_*` setting (service/settings.py), and `workers` (the front
        processes: limits that are per front hold that many times over) and `engines` (the engine processes:
        the engine's queue limits hold that many times over)."""
        for name, value in settings.model_dump().items():
            if name.startswith("max_") and isinstance(value, int | float):
                self.limit.labels(name).set(value)
        self.limit.labels("workers").set(settings.worker_count())
        self.limit.labels("engines").set(settings.engines)

    def serve_http(self, host: str, port: int) -> int:
        """Starts /metrics on a thread of its own; returns the bound port. Raises OSError if it cannot bind."""
        if self.multiprocess:
            raise RuntimeError("with several processes the supervisor serves /metrics (serve_aggregated)")
        self._http = MetricsHTTPServer(self.registry)
        return self._http.start(host, port)

    def stop_http(self) -> None:
        if self._http is not None:
            self._http.stop()
            self._http = None
