"""One scrape of /metrics covers every process (service/metrics_multiprocess.py, issue 26).

Three spawned processes (an engine and two fronts, as far as metrics go: tests/helpers/metrics_child.py)
each create `Metrics(multiprocess=True)` on one directory and record known amounts; the supervisor's
aggregated scrape, served over HTTP by the bounded metrics server, shows their sums with the same names
and label sets as one process. A front that exits and is marked dead leaves the live gauges; its counters
stay. Without PROMETHEUS_MULTIPROC_DIR in a child's starting environment, Metrics(multiprocess=True)
refuses to start rather than count where no scrape looks.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest

from bertserve.service import metrics_multiprocess as mp
from bertserve.service.metrics import Metrics
from bertserve.service.settings import Settings
from tests.helpers import metrics_child
from tests.helpers.server import metric, scrape

MODEL = metrics_child.MODEL
START_S = 120  # a spawned child imports the service's modules on a loaded machine
# fmt: off
PLANS = {
    "engine": dict(
        requests=0, inputs=0, batches=[4, 8], connections=0, streams=0, lag=0.004, queue=5, rejected=0,
        cost=(5e-4, 5e-7),
    ),
    "front-0": dict(
        requests=3, inputs=7, batches=[], connections=2, streams=1, lag=0.03, queue=0, rejected=0, cost=None
    ),
    "front-1": dict(
        requests=5, inputs=11, batches=[], connections=4, streams=1, lag=0.01, queue=0, rejected=1, cost=None
    ),
}
# fmt: on


def _only(samples: dict, name: str, **labels) -> float:
    """The value of the one sample `name` whose labels are exactly `labels` (no pid label, no other
    series of that name with other labels)."""
    found = {key: value for key, value in samples.items() if key[0] == name}
    key = (name, tuple(sorted(labels.items())))
    assert list(found) == [key], f"{name}: expected only {key}, got {sorted(found)}"
    return found[key]


@pytest.fixture
def processes():
    """The three children, recording their plans into one multiprocess directory; released at the end."""
    path = mp.create_dir()
    spawn = multiprocessing.get_context("spawn")
    children = {}
    with mp.child_environment(path):
        for name, plan in PLANS.items():
            ready, release = spawn.Event(), spawn.Event()
            process = spawn.Process(target=metrics_child.count, args=(plan, ready, release), daemon=True)
            process.start()
            children[name] = (process, ready, release)
    try:
        for name, (process, ready, _) in children.items():
            assert ready.wait(START_S), f"{name} never recorded its metrics (exit code {process.exitcode})"
        yield path, children
    finally:
        for _, _, release in children.values():
            release.set()
        for process, _, _ in children.values():
            process.join(30)
            if process.is_alive():
                process.kill()
        mp.remove_dir(path)


def test_one_scrape_sums_every_process_and_a_dead_front_leaves_its_live_gauges(processes):
    path, children = processes
    live = {name: process.pid for name, (process, _, _) in children.items()}
    server = mp.serve_aggregated(path, "127.0.0.1", 0, children=lambda: dict(live))
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        samples = scrape(url)
        # the names and types of one process's registry (the README's Monitor table), no more, no fewer
        single = {f.name: f.type for f in Metrics().registry.collect() if f.name.startswith("bertserve_")}
        aggregated = {f.name: f.type for f in mp.aggregate_registry(path).collect()}
        assert {n: t for n, t in aggregated.items() if n.startswith("bertserve_")} == single
        assert _only(samples, "bertserve_requests_total", rpc="Embed", code="OK") == 8
        assert _only(samples, "bertserve_request_duration_seconds_count", rpc="Embed") == 8
        assert _only(samples, "bertserve_inputs_total", model=MODEL, task="embed") == 18
        assert _only(samples, "bertserve_tokenized_inputs_total", model=MODEL) == 18
        assert _only(samples, "bertserve_stream_requests_total", code="OK") == 2
        assert _only(samples, "bertserve_http_connections_total", outcome="accepted") == 6
        assert _only(samples, "bertserve_http_rejected_total", status="408") == 1
        assert _only(samples, "bertserve_batch_size_count", model=MODEL) == 2
        assert _only(samples, "bertserve_batch_size_sum", model=MODEL) == 12
        assert metric(samples, "bertserve_batch_size_bucket", model=MODEL, le="4.0") == 1
        assert _only(samples, "bertserve_queue_duration_seconds_count", model=MODEL) == 12
        # gauges: summed (open connections, streams, queue depth) or one value (max, model_info, limit)
        assert _only(samples, "bertserve_http_connections_open") == 6
        assert _only(samples, "bertserve_streams_open") == 2
        assert _only(samples, "bertserve_queue_depth", model=MODEL) == 5
        assert _only(samples, "bertserve_event_loop_lag_max_seconds") == 0.03
        cost = {
            dict(labels)["term"]: v
            for (n, labels), v in samples.items()
            if n == "bertserve_batch_cost_seconds"
        }
        assert cost == {"fixed": 5e-4, "token": 5e-7}  # the engine's line, once
        info = dict(
            model=MODEL, version="1", precision="fp32", provider="CPUExecutionProvider", tasks="embed"
        )
        assert _only(samples, "bertserve_model_info", **info) == 1
        limits = {
            dict(labels)["name"]: value
            for (name, labels), value in samples.items()
            if name == "bertserve_limit"
        }
        assert limits["max_queue_inputs"] == 300 and limits["max_batch_size"] == Settings().max_batch_size
        assert set(limits) == {name for name in Settings.model_fields if name.startswith("max_")} | {
            "workers",
            "engines",
        }
        assert not [key for key in samples if "pid" in dict(key[1])], "a series carries the pid label"
        # process_* for the supervisor and each child, told apart by `process`
        for name in (mp.SUPERVISOR, *PLANS):
            assert metric(samples, "process_resident_memory_bytes", process=name) > 0, name
        assert metric(samples, "python_info") == 1

        front, _, release = children["front-0"]
        release.set()
        front.join(30)
        assert front.exitcode == 0
        del live["front-0"]
        mp.mark_dead(front.pid, path)
        after = scrape(url)
        assert _only(after, "bertserve_http_connections_open") == 4
        assert _only(after, "bertserve_streams_open") == 1
        assert _only(after, "bertserve_event_loop_lag_max_seconds") == 0.01
        assert _only(after, "bertserve_model_info", **info) == 1
        # what the dead front counted stays: totals never go down
        assert _only(after, "bertserve_requests_total", rpc="Embed", code="OK") == 8
        assert _only(after, "bertserve_inputs_total", model=MODEL, task="embed") == 18
        assert metric(after, "process_resident_memory_bytes", process="front-0") == 0
    finally:
        server.stop()


def test_multiprocess_metrics_refuse_a_process_that_would_not_reach_the_scrape(tmp_path):
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        without_env = child.submit(metrics_child.multiprocess_error, None).result(START_S)
    assert "PROMETHEUS_MULTIPROC_DIR set to an existing directory" in without_env
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        imported_first = child.submit(metrics_child.multiprocess_error, str(tmp_path)).result(START_S)
    assert "imported before PROMETHEUS_MULTIPROC_DIR was set" in imported_first
