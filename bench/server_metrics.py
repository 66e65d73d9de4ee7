"""Server-side figures from the Prometheus endpoint: scraped before and after a phase, then differenced.

Uses the metric names of docs/architecture.md (prefix `bertserve_`). A metric the server does not
export yields None, never zero.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, tuple[tuple[str, str], ...]]


def _fetch(url: str) -> dict[Sample, float]:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (a 127.0.0.1 URL we built)
        text = response.read().decode()
    samples: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


async def scrape(url: str | None) -> dict[Sample, float]:
    """All samples at `url` (empty when there is no metrics endpoint)."""
    return {} if url is None else await asyncio.to_thread(_fetch, url)


def _total(samples: dict[Sample, float], name: str) -> float | None:
    values = [value for (sample, _), value in samples.items() if sample == name]
    return sum(values) if values else None


def _delta(before: dict[Sample, float], after: dict[Sample, float], name: str) -> float | None:
    end = _total(after, name)
    return None if end is None else end - (_total(before, name) or 0.0)


def _ratio(numerator: float | None, denominator: float | None, scale: float = 1.0) -> float | None:
    if numerator is None or not denominator:
        return None
    return scale * numerator / denominator


def phase_delta(before: dict[Sample, float], after: dict[Sample, float], seconds: float) -> dict:
    """What the server did between two scrapes: means of its histograms and totals of its counters."""
    if not after:
        return {}
    p = "bertserve_"

    def mean(histogram: str, scale: float = 1.0) -> float | None:
        return _ratio(
            _delta(before, after, f"{p}{histogram}_sum"),
            _delta(before, after, f"{p}{histogram}_count"),
            scale,
        )

    inference_busy = _delta(before, after, f"{p}inference_duration_seconds_sum")
    batches = _delta(before, after, f"{p}batch_size_count")
    codes: dict[str, float] = defaultdict(float)
    for (sample, labels), value in after.items():
        if sample == f"{p}requests_total":
            codes[dict(labels).get("code", "?")] += value - before.get((sample, labels), 0.0)
    padded = _delta(before, after, f"{p}batch_tokens_sum")
    return {
        "queue_ms_mean": mean("queue_duration_seconds", 1e3),  # per input, enqueue to compute
        "inference_ms_mean": mean("inference_duration_seconds", 1e3),  # per batch
        # of which ONNX Runtime's run; and wall time per batch: what is neither is the engine between batches
        "encoder_run_ms_mean": mean("encoder_run_duration_seconds", 1e3),
        "batch_cycle_ms": _ratio(seconds, batches, 1e3),
        "inference_busy_fraction": _ratio(inference_busy, seconds),  # time the model ran / wall time
        "request_ms_mean": mean("request_duration_seconds", 1e3),
        "batches": batches,
        "batch_size_mean": mean("batch_size"),
        "batch_tokens_padded": padded,
        # the encoder's own speed: compute time per padded token (grows when other threads take its cores)
        "inference_us_per_padded_token": _ratio(inference_busy, padded, 1e6),
        "padding_ratio_mean_per_batch": mean("padding_ratio"),
        "inputs": _delta(before, after, f"{p}inputs_total"),
        "dropped": _delta(before, after, f"{p}dropped_total"),
        "requests_by_code": {code: count for code, count in codes.items() if count},
    }


def batch_cost(samples: dict[Sample, float]) -> dict | None:
    """The line the server cuts batches by (`bertserve_batch_cost_seconds`, its first encoder's), in ms per
    batch and us per padded token; None where it cuts by padding (no line) or serves no metrics."""
    terms: dict[str, dict[str, float]] = {}
    for (name, labels), value in samples.items():
        if name == "bertserve_batch_cost_seconds":
            found = dict(labels)
            terms.setdefault(found.get("model", ""), {})[found.get("term", "")] = value
    line = next((terms[model] for model in sorted(terms) if {"fixed", "token"} <= terms[model].keys()), None)
    return None if line is None else {"fixed_ms": 1e3 * line["fixed"], "token_us": 1e6 * line["token"]}
