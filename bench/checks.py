"""In-process figures measured again, off the event loop, right before and after a phase: what the phase
is held against on a machine whose speed drifts between a run's first measurement and the phase."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from bertserve.bench import inprocess
from bertserve.bench.config import BenchConfig
from bertserve.bench.corpus import Corpus
from bertserve.manifest import ENCODER

Check = Callable[[], Awaitable[float]]


def again(measure: Callable[..., dict], key: str, digits: int, *args) -> Check:
    """A check: `measure(*args)[key]` measured again each time it is awaited."""

    async def check() -> float:
        return round((await asyncio.to_thread(measure, *args))[key], digits)

    return check


def ceiling_check(config: BenchConfig, model, tokenizer, mixed: Corpus, found: dict) -> Check:
    """The fp32 mixed ceiling (inputs/s) at the batch size and layout found best (same passes): what
    server-fp32's sweep and lone stream are held against. `model`: bench.model_setup.ModelUnderTest."""
    return again(
        inprocess.measure_ceiling, "inputs_per_s", 2,
        model.graph(ENCODER), tokenizer, mixed, config.threads, [found["best_batch_size"]],
        config.ceiling_passes, found["instances"], config.provider, found["shared_session"],
        found["threads_per_instance"], config.ceiling_min_s,
    )  # fmt: skip


def single_latency_args(config: BenchConfig, model, tokenizer, mixed: Corpus) -> tuple:
    """`inprocess.measure_single_latency`'s arguments, for the run's first measurement and its checks alike."""
    count = min(len(mixed.texts), config.single_latency_texts)
    return model.graph(ENCODER), tokenizer, mixed, config.threads, count, config.provider


def single_check(config: BenchConfig, model, tokenizer, mixed: Corpus) -> Check:
    """The in-process p50 of one input at a time (ms), as the run's first measurement: what a c=1 phase
    is held against."""
    args = single_latency_args(config, model, tokenizer, mixed)
    return again(inprocess.measure_single_latency, "p50_ms", 3, *args)
