"""One /metrics for many processes (`serve --workers N`): prometheus_client's multiprocess mode.

Every child (engine, fronts) creates `Metrics(multiprocess=True)`; its counters, histograms and gauges are
written to files in a private directory, and the supervisor serves one scrape that adds them up
(`serve_aggregated`). The rule a child must follow: PROMETHEUS_MULTIPROC_DIR is in its environment before
it first imports prometheus_client, which picks its value class once at import (a spawned child may import
it while re-importing the parent's __main__), so the supervisor sets the variable before Process.start()
(`child_environment`). How each gauge combines is its `multiprocess_mode` in service/metrics.py.

What multiprocess mode cannot run in the scraping process, and what stands in for it here:
- process_* (a custom collector reading /proc/self): the supervisor reads /proc/<pid> of itself and of
  each child it names, one series per process, labelled `process` (`ProcessTable`);
- python_gc_* (a custom collector reading gc.get_stats() of its own process): the supervisor's only;
- python_info: the supervisor's, the same interpreter as its children's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client import values as client_values
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from bertserve.service.metrics_http import MetricsHTTPServer

ENV = "PROMETHEUS_MULTIPROC_DIR"
SUPERVISOR = "supervisor"  # the `process` label of the supervisor's own process_* series

Children = Callable[[], Mapping[str, int]]  # `process` label -> pid of each live child, asked at each scrape


def require_multiprocess_mode() -> None:
    """Raises RuntimeError unless this process writes its metrics to the multiprocess directory."""
    path = os.environ.get(ENV)
    if not path or not os.path.isdir(path):
        raise RuntimeError(f"multiprocess metrics need {ENV} set to an existing directory, got {path!r}")
    # prometheus_client picks its value class once, when it is first imported
    if client_values.ValueClass is client_values.MutexValue:
        raise RuntimeError(
            f"prometheus_client was imported before {ENV} was set: this process's metrics would not reach "
            "the aggregated scrape (set it in the environment the child starts with)"
        )


def create_dir() -> str:
    """A fresh private directory for one server run's metric files (the supervisor removes it at exit)."""
    return tempfile.mkdtemp(prefix="bertserve-metrics-")


def remove_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def child_environment(path: str) -> Iterator[None]:
    """PROMETHEUS_MULTIPROC_DIR=path for the children started (spawn) inside; restored afterwards."""
    previous = os.environ.get(ENV)
    os.environ[ENV] = path
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous


def mark_dead(pid: int, path: str) -> None:
    """A child exited: its live gauges (open connections, streams, queue depth, loop lag, model_info)
    leave the scrape; its counters and histograms stay, so totals never go down."""
    mark_process_dead(pid, path)


class ProcessTable(Collector):
    """process_* of the supervisor and of each child, read by the supervisor from /proc/<pid>: multiprocess
    mode cannot run a child's own ProcessCollector. Every series carries `process`; a child that has
    exited meanwhile is left out."""

    def __init__(self, children: Children | None = None):
        self._children = children

    def collect(self) -> Iterable[Metric]:
        processes = {SUPERVISOR: os.getpid(), **(self._children() if self._children else {})}
        families: dict[str, Metric] = {}
        for name, pid in processes.items():
            for family in ProcessCollector(pid=lambda pid=pid: pid, registry=None).collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = family
                    samples, family.samples = family.samples, []
                else:
                    samples = family.samples
                merged.samples.extend(
                    Sample(s.name, {**s.labels, "process": name}, s.value, s.timestamp) for s in samples
                )
        return list(families.values())


def aggregate_registry(path: str, children: Children | None = None) -> CollectorRegistry:
    """Every process's metrics from `path`, plus process_* per process and the supervisor's python_*."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    registry.register(ProcessTable(children))
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def serve_aggregated(path: str, host: str, port: int, children: Children | None = None) -> MetricsHTTPServer:
    """Starts the bounded /metrics server (service/metrics_http.py) on the aggregated registry; its `port`
    is the bound port and `stop()` ends it. Raises OSError if it cannot bind."""
    server = MetricsHTTPServer(aggregate_registry(path, children))
    server.start(host, port)
    return server
