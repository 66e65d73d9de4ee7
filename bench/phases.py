"""What a target's load is made of: the Embed call (gRPC's Python client and the native load generator's
bytes) and a phase's two steps, warm-up and measure (bench/targets.py runs them)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Protocol

import grpc

from bertserve.bench.loadgen import Call, PhaseResult
from bertserve.bench.native_loadgen import NativeMethod
from bertserve.v1 import inference_pb2, inference_pb2_grpc

REQUEST_TIMEOUT_S = 300.0  # a hung server fails its requests (DEADLINE_EXCEEDED), never the bench
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 2**20)]


def own_channel(address: str) -> grpc.aio.Channel:
    """A channel with a connection of its own (channels with equal options would share one)."""
    return grpc.aio.insecure_channel(
        address, options=[*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    )


def embed_request(texts: list[str], model: str) -> inference_pb2.EmbedRequest:
    return inference_pb2.EmbedRequest(inputs=texts, model=model, truncate=True)


def embed_call(channel: grpc.aio.Channel, model: str) -> Call:
    stub = inference_pb2_grpc.InferenceStub(channel)

    async def call(texts: list[str]) -> inference_pb2.EmbedResponse:
        return await stub.Embed(embed_request(texts, model), timeout=REQUEST_TIMEOUT_S)

    return call


def native_embed(model: str) -> NativeMethod:
    """Embed as the native load generator sends it: the same request bytes as `embed_call`."""
    return NativeMethod(
        "/bertserve.v1.Inference/Embed",
        lambda request: embed_request(request.texts, model).SerializeToString(),
        inference_pb2.EmbedResponse.FromString,
    )


class Phase(Protocol):
    """A load-generator phase in two steps, so that only `measure` falls between the server's readings;
    `close` ends whatever it still runs (after `measure`, or when a step failed or was cancelled)."""

    # the load generator runs in a process of its own, whose CPU `measure` returns (client_cpu_s)
    own_process: bool

    async def warm_up(self) -> None: ...

    async def measure(self) -> PhaseResult: ...

    async def close(self) -> None: ...


@dataclass
class PythonPhase:
    """A phase of the in-process Python client (bench/loadgen.py): each step a coroutine made on demand."""

    warm: Callable[[], Coroutine[None, None, PhaseResult]] | None
    run: Callable[[], Coroutine[None, None, PhaseResult]]
    own_process = False  # a class attribute, not a field: the bench reads this process's CPU

    async def warm_up(self) -> None:
        if self.warm is not None:
            await self.warm()

    async def measure(self) -> PhaseResult:
        return await self.run()

    async def close(self) -> None:
        pass  # its coroutines end with their steps
