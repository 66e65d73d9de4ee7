"""The load generator: closed loop at a fixed concurrency, open loop at a fixed request rate.

Both send a fixed list of requests (the same texts for every target, so every target encodes the same
lengths) through `call`, an async function that sends one request's texts and returns the server's
reply. Latency is measured per request on the client; the open loop measures it from the request's
scheduled send time, so a server that falls behind is charged for the wait (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TypeVar

import grpc

from bertserve.bench.stats import latency_summary

Call = Callable[[list[str]], Awaitable[object]]
T = TypeVar("T")


class CallFailed(Exception):
    """A failed call of a non-gRPC client (bench.http_client); `code` is the status name it counts under."""

    code: str = "UNKNOWN"


@dataclass(frozen=True)
class Request:
    texts: list[str]
    tokens: int  # real tokens of all its texts, as the model's tokenizer counts them
    flops: float  # useful FLOPs to encode its texts (bench.flops), padding excluded


@dataclass
class PhaseResult:
    """What one closed- or open-loop run measured (failed requests count only in `errors`)."""

    mode: str  # "closed" or "open"
    concurrency: int | None = None
    offered_rate: float | None = None  # requests/s, open loop only
    requests_planned: int = 0
    stopped_early: bool = False  # the phase hit its time limit before sending every planned request
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # of successful requests, seconds
    queue_ms: list[float] = field(default_factory=list)  # server-reported, from each reply's metadata
    inference_ms: list[float] = field(default_factory=list)
    tokenize_ms: list[float] = field(default_factory=list)
    reply_tokens: int = 0  # the server's own count of real tokens (metadata.total_tokens), to cross-check
    inputs: int = 0
    tokens: int = 0
    flops: float = 0.0
    errors: Counter = field(default_factory=Counter)  # status code name -> count
    # CPU seconds of a load generator in another process (bench/native_loadgen.py) over the measured
    # requests; 0 for this process's, which the bench reads itself
    client_cpu_s: float = 0.0
    client_threads: int = 1  # the native load generator's threads in the measured part

    @classmethod
    def merged(cls, parts: list[PhaseResult]) -> PhaseResult:
        """One result over several windows of the same phase (lists joined, counts and seconds added)."""
        out = cls(parts[0].mode, parts[0].concurrency, parts[0].offered_rate)
        for part in parts:
            for f in fields(cls)[3:]:
                mine, theirs = getattr(out, f.name), getattr(part, f.name)
                setattr(out, f.name, (mine or theirs) if isinstance(mine, bool) else mine + theirs)
        return out

    def summary(self) -> dict:
        requests = len(self.latencies)
        return {
            "mode": self.mode,
            "concurrency": self.concurrency,
            "offered_rate_rps": self.offered_rate,
            "seconds": self.seconds,
            "requests_planned": self.requests_planned,
            "stopped_early": self.stopped_early,
            "requests_ok": requests,
            "errors": dict(self.errors),
            "inputs": self.inputs,
            "tokens": self.tokens,
            "requests_per_s": requests / self.seconds if self.seconds else float("nan"),
            "inputs_per_s": self.inputs / self.seconds if self.seconds else float("nan"),
            "tokens_per_s": self.tokens / self.seconds if self.seconds else float("nan"),
            "gflops_per_s": self.flops / self.seconds / 1e9 if self.seconds else float("nan"),
            **latency_summary(self.latencies),
            "reply_queue_ms_mean": _mean(self.queue_ms),
            "reply_inference_ms_mean": _mean(self.inference_ms),
            "reply_tokenize_ms_mean": _mean(self.tokenize_ms),
            "reply_tokens": self.reply_tokens,
        }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


async def between_checks(
    check: Callable[[], Awaitable[float]] | None, work: Awaitable[T]
) -> tuple[T, list[float]]:
    """Awaits `work` between two calls of `check` (the in-process ceiling, measured again): (its result,
    [before, after]); no checks when `check` is None."""
    before = [await check()] if check else []
    result = await work
    return result, before + ([await check()] if check else [])


def make_requests(
    texts: Sequence[str], tokens: Sequence[int], inputs_per_request: int, flops_of: Callable[[int], float]
) -> list[Request]:
    """Consecutive texts grouped `inputs_per_request` at a time; `flops_of(tokens)` prices one input."""
    requests = []
    for i in range(0, len(texts), inputs_per_request):
        counts = tokens[i : i + inputs_per_request]
        requests.append(
            Request(list(texts[i : i + inputs_per_request]), sum(counts), sum(map(flops_of, counts)))
        )
    return requests


def repeated(requests: Sequence[Request], count: int) -> list[Request]:
    """`requests` in order, over again until there are at least `count` of them."""
    if not requests or len(requests) >= count:
        return list(requests)
    return [requests[i % len(requests)] for i in range(count)]


class _Progress:
    """A one-line counter on a terminal (updated on completions, never on a timer); silent otherwise."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self.enabled = sys.stderr.isatty()
        self.step = max(1, total // 20)

    def tick(self) -> None:
        self.done += 1
        if self.enabled and (self.done % self.step == 0 or self.done == self.total):
            sys.stderr.write(f"\r  {self.label}: {self.done}/{self.total} requests")
            if self.done == self.total:
                sys.stderr.write("\r" + " " * (len(self.label) + 40) + "\r")
            sys.stderr.flush()


def record_reply(result: PhaseResult, request: Request, latency_s: float, reply: object) -> None:
    """Counts one answered request: its latency, its inputs and the server's metadata in its reply."""
    result.latencies.append(latency_s)
    metadata = getattr(reply, "metadata", None)
    if metadata is not None:
        result.queue_ms.append(metadata.queue_time_ms)
        result.inference_ms.append(metadata.inference_time_ms)
        result.tokenize_ms.append(metadata.tokenize_time_ms)
        result.reply_tokens += metadata.total_tokens
    result.inputs += len(request.texts)
    result.tokens += request.tokens
    result.flops += request.flops


def poisson_offsets(count: int, rate: float, seed: int = 0) -> list[float]:
    """Send times (seconds from the phase's start) of `count` Poisson arrivals at mean `rate` per second."""
    rng = random.Random(seed)
    offsets, at = [], 0.0
    for _ in range(count):
        at += rng.expovariate(rate)
        offsets.append(at)
    return offsets


async def _send(call: Call, request: Request, started: float, result: PhaseResult) -> None:
    try:
        reply = await call(request.texts)
    except grpc.aio.AioRpcError as error:
        result.errors[error.code().name] += 1
        return
    except CallFailed as error:
        result.errors[error.code] += 1
        return
    record_reply(result, request, time.perf_counter() - started, reply)


async def closed_loop(
    call: Call, requests: list[Request], concurrency: int, label: str = "", time_limit_s: float | None = None
) -> PhaseResult:
    """`concurrency` callers, each sending its next request as soon as its last one is answered; none is
    sent after `time_limit_s` (the rest of the list is skipped and the result says so)."""
    result = PhaseResult("closed", concurrency=concurrency, requests_planned=len(requests))
    pending = iter(requests)
    progress = _Progress(label or f"closed c={concurrency}", len(requests))
    start = time.perf_counter()
    deadline = start + time_limit_s if time_limit_s else float("inf")

    async def caller() -> None:
        for request in pending:  # shared iterator: each request is sent exactly once
            if time.perf_counter() > deadline:
                result.stopped_early = True
                return
            await _send(call, request, time.perf_counter(), result)
            progress.tick()

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    result.seconds = time.perf_counter() - start
    return result


async def open_loop(
    call: Call,
    requests: list[Request],
    rate: float,
    seed: int = 0,
    label: str = "",
    time_limit_s: float | None = None,
) -> PhaseResult:
    """Requests sent at Poisson arrival times of mean `rate` per second, whether or not earlier ones are
    done; arrivals stop after `time_limit_s` (those sent are still awaited)."""
    result = PhaseResult("open", offered_rate=rate, requests_planned=len(requests))
    progress = _Progress(label or f"open {rate:.1f} req/s", len(requests))

    async def timed(request: Request, scheduled: float) -> None:
        await _send(call, request, scheduled, result)
        progress.tick()

    start = time.perf_counter()
    tasks = []
    deadline = start + time_limit_s if time_limit_s else float("inf")
    for request, offset in zip(requests, poisson_offsets(len(requests), rate, seed), strict=True):
        scheduled = start + offset
        if scheduled > deadline:
            result.stopped_early = True
            break
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # waiting for the next arrival time of the schedule
        tasks.append(asyncio.create_task(timed(request, scheduled)))
    await asyncio.gather(*tasks)
    result.seconds = time.perf_counter() - start
    return result
