"""Summaries of measured latencies and rates."""

from __future__ import annotations

import numpy as np

PERCENTILES = (50, 90, 99)


def latency_summary(seconds: list[float]) -> dict[str, float]:
    """p50/p90/p99, mean and max in milliseconds (empty input gives NaN, never a made-up figure)."""
    if not seconds:
        return {f"p{p}_ms": float("nan") for p in PERCENTILES} | {
            "mean_ms": float("nan"),
            "max_ms": float("nan"),
        }
    ms = np.asarray(seconds) * 1e3
    summary = {f"p{p}_ms": float(np.percentile(ms, p)) for p in PERCENTILES}
    return summary | {"mean_ms": float(ms.mean()), "max_ms": float(ms.max())}
