"""The streaming phases of `bertserve bench` (bertserve's gRPC target only): EmbedStream's throughput over
the mixed corpus, and what a running stream costs a lone unary caller.

- stream alone: one EmbedStream carrying the mixed corpus, repeated up to `STREAM_MIN_INPUTS` inputs so
  that the first batches and the last answer weigh little (`STREAM_BATCH` texts per request, at most
  `STREAM_REQUESTS_IN_FLIGHT` requests unanswered, as `Client.embed_stream` does): inputs/s, to compare
  with the in-process ceiling, which is measured again right before and right after it (`ceiling_check`),
  so that the machine's drift between the bench's first ceiling and this phase does not enter the ratio.
- unary alone, then unary during a stream: one caller sending the corpus's requests one after the other
  (closed loop, concurrency 1), first alone, then while a stream cycles over the corpus, in
  `UNARY_WINDOWS` alternating pairs of windows (drift again): p50/p99 over each side's windows together,
  and the stream's own rate meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Iterator

import grpc

from bertserve.bench.loadgen import PhaseResult, Request, between_checks, closed_loop
from bertserve.client_stream import DEFAULT_BATCH_SIZE
from bertserve.v1 import inference_pb2, inference_pb2_grpc

STREAM_BATCH = DEFAULT_BATCH_SIZE  # texts per EmbedStream request (Client.embed_stream's default)
STREAM_REQUESTS_IN_FLIGHT = 8  # requests sent and not yet answered (Client.embed_stream's default)
STREAM_MIN_INPUTS = 1000  # inputs the lone stream carries at least (the corpus repeated)
UNARY_CONCURRENCY = 1  # a lone latency-sensitive caller
UNARY_WINDOWS = 2  # alone / during-a-stream pairs, alternated; each gets 1/UNARY_WINDOWS of the time limit
TIMEOUT_S = 600.0
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 2**20)]


async def run_stream(
    stub: inference_pb2_grpc.InferenceStub, model: str, chunks: Iterator[list[str]], stop: asyncio.Event
) -> dict:
    """Streams `chunks` (until they end or `stop` is set); returns inputs, seconds and inputs/s."""
    call = stub.EmbedStream(timeout=TIMEOUT_S)
    slots = asyncio.Semaphore(STREAM_REQUESTS_IN_FLIGHT)
    answered = {"inputs": 0, "requests": 0, "errors": 0}
    started = time.perf_counter()

    async def send() -> None:
        for request_id, chunk in enumerate(chunks):
            await slots.acquire()
            if stop.is_set():
                break
            await call.write(
                inference_pb2.EmbedStreamRequest(id=request_id, inputs=chunk, model=model, truncate=True)
            )
        await call.done_writing()

    sender = asyncio.create_task(send())
    async for response in call:
        answered["requests"] += 1
        if response.WhichOneof("outcome") == "error":
            answered["errors"] += 1
        else:
            answered["inputs"] += len(response.result.embeddings)
        slots.release()
    await sender
    seconds = time.perf_counter() - started
    return answered | {"seconds": seconds, "inputs_per_s": answered["inputs"] / seconds}


def _chunks(texts: list[str], cycle: bool) -> Iterator[list[str]]:
    source = itertools.cycle(texts) if cycle else iter(texts)
    while chunk := list(itertools.islice(source, STREAM_BATCH)):
        yield chunk


async def phases(
    address: str,
    model: str,
    texts: list[str],
    requests: list[Request],
    time_limit_s: float | None,
    log: Callable,
    ceiling_check: Callable[[], Awaitable[float]] | None = None,
) -> dict:
    """The three streaming phases against the server at `address` (already warm); `ceiling_check` measures
    the in-process ceiling (inputs/s) while the server idles."""
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)

        async def unary(texts: list[str]) -> inference_pb2.EmbedResponse:
            request = inference_pb2.EmbedRequest(inputs=texts, model=model, truncate=True)
            return await stub.Embed(request, timeout=TIMEOUT_S)

        repeats = -(-STREAM_MIN_INPUTS // max(1, len(texts)))
        stream = run_stream(stub, model, _chunks(texts * repeats, cycle=False), asyncio.Event())
        alone, ceilings = await between_checks(ceiling_check, stream)
        alone["ceiling_checks"] = ceilings  # in-process inputs/s right before and right after
        log(
            f"  stream alone: {alone['inputs_per_s']:.1f} inputs/s ({alone['inputs']} inputs); ceiling {ceilings}"
        )
        window_s = time_limit_s / UNARY_WINDOWS if time_limit_s else None
        lone_parts, during_parts, beside_parts = [], [], []
        for _ in range(UNARY_WINDOWS):
            lone_parts.append(await closed_loop(unary, requests, UNARY_CONCURRENCY, "unary alone", window_s))
            stop = asyncio.Event()
            background = asyncio.create_task(run_stream(stub, model, _chunks(texts, cycle=True), stop))
            during_parts.append(
                await closed_loop(unary, requests, UNARY_CONCURRENCY, "unary during a stream", window_s)
            )
            stop.set()
            beside_parts.append(await background)
        lone = PhaseResult.merged(lone_parts).summary()
        during = PhaseResult.merged(during_parts).summary()
        beside = {
            key: sum(b[key] for b in beside_parts) for key in ("inputs", "requests", "errors", "seconds")
        }
        beside["inputs_per_s"] = beside["inputs"] / beside["seconds"] if beside["seconds"] else 0.0
    log(
        f"  unary c={UNARY_CONCURRENCY}: alone p50 {lone['p50_ms']:.1f} ms p99 {lone['p99_ms']:.1f} ms; during a "
        f"stream p50 {during['p50_ms']:.1f} ms p99 {during['p99_ms']:.1f} ms (stream meanwhile "
        f"{beside['inputs_per_s']:.1f} inputs/s)"
    )
    return {
        "batch_size": STREAM_BATCH,
        "unary_windows": UNARY_WINDOWS,
        "requests_in_flight": STREAM_REQUESTS_IN_FLIGHT,
        "alone": alone,
        "unary_alone": lone,
        "unary_during_stream": during,
        "stream_beside_unary": beside,
    }
