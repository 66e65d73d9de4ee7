"""A process of a many-process server, as far as metrics go: run in a spawned child, it creates
`Metrics(multiprocess=True)` and records known amounts the way the server's code does, then stays alive
(its live gauges count) until the test lets it exit. prometheus_client is imported inside `count` only,
so the child imports it with the environment it was started with."""

from __future__ import annotations

MODEL = "tiny-embed"


def count(plan: dict, ready, release) -> None:
    """`plan`: requests (answered OK), inputs, batches (sizes, one batch each), connections (HTTP open),
    streams (open, one request answered OK each), lag (loop lag max, s), queue (queue depth; only the
    engine sets it), rejected (HTTP 408s). Sets `ready` once
    recorded, exits when `release` is set (or after a bound, so a failed test leaves no process)."""
    from bertserve.service.engine.batch_items import BatchStats
    from bertserve.service.engine.batch_metrics import ModelObserver
    from bertserve.service.metrics import Metrics
    from bertserve.service.settings import Settings

    m = Metrics(multiprocess=True)
    m.export_limits(Settings(max_queue_inputs=300))
    m.model_info.labels(MODEL, "1", "fp32", "CPUExecutionProvider", "embed").set(1)
    observer = ModelObserver(m, MODEL, "encoder")  # every process that holds the model creates its series
    for _ in range(plan["requests"]):
        m.answered("Embed", "OK", 0.003)
    m.inputs_of(MODEL, "embed").inc(plan["inputs"])
    m.tokenized_of(MODEL).inc(plan["inputs"])
    for size in plan["batches"]:
        m.encoder_run_duration.labels(MODEL).observe(0.015)  # the encoder's run within the batch's compute
        observer.batch_done(BatchStats(size, 16 * size, 12 * size, [0.002] * size, 0.02))
    if plan["queue"]:
        observer.queue_depth(plan["queue"])
    if plan["cost"]:
        observer.batch_cost(*plan["cost"])
    if plan["connections"]:
        m.http_connections.labels("accepted").inc(plan["connections"])
    m.http_connections_open.set(plan["connections"])
    if plan["rejected"]:
        m.http_rejected.labels("408").inc(plan["rejected"])
    for _ in range(plan["streams"]):
        m.streams_open.inc()
        m.stream_requests.labels("OK").inc()
    m.event_loop_lag_max.set(plan["lag"])
    ready.set()
    release.wait(300)


def multiprocess_error(import_first: str | None) -> str:
    """What Metrics(multiprocess=True) raises in a child: started without PROMETHEUS_MULTIPROC_DIR, or
    (import_first: a directory) with it set only after prometheus_client was imported."""
    import os

    if import_first is not None:
        import prometheus_client  # noqa: F401

        os.environ["PROMETHEUS_MULTIPROC_DIR"] = import_first
    from bertserve.service.metrics import Metrics

    try:
        Metrics(multiprocess=True)
    except RuntimeError as exc:
        return str(exc)
    return "no error"
