"""`observe_each` (service/metrics.py): a batch's per-input waits recorded in one write per bucket, read
by a scrape exactly as the same values observed one by one."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram

from bertserve.service.metrics import LATENCY_BUCKETS, observe_each

WAITS = [0.0, 0.001, 0.0010001, 0.004, 0.004, 2.5, 31.0, math.inf, 0.0007, 0.02]  # bounds, between, past


def _samples(registry: CollectorRegistry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in registry.collect() for s in f.samples}


@pytest.mark.parametrize("values", [WAITS, [0.003], []])
def test_observe_each_writes_what_observing_one_by_one_writes(values):
    one_by_one, batched = CollectorRegistry(), CollectorRegistry()
    for registry, record in ((one_by_one, None), (batched, observe_each)):
        histogram = Histogram("wait", "w", ["model"], buckets=LATENCY_BUCKETS, registry=registry)
        child = histogram.labels("m")
        if record is None:
            for value in values:
                child.observe(value)
        else:
            record(child, values)
    want, got = _samples(one_by_one), _samples(batched)
    assert want.keys() == got.keys()
    for key, value in want.items():
        if key[0].endswith("_created"):
            continue
        assert got[key] == pytest.approx(value, rel=1e-12), key
