"""Attention maps: one input through a model's `encoder_attentions` graph (fp32, unfused).

An Attention call holds one input and does not go through the batcher: it runs on the model's worker
thread (the one its batcher computes on), so it never runs at the same time as that model's batches and
never competes with them for ONNX Runtime's threads; a batch waits for at most one attention run. The
graph outputs `attentions` (layers, batch, heads, sequence, sequence); the input is alone, so there is
no padding and every row is a real query token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bertserve.service.errors import InferenceFailed, InvalidInput
from bertserve.service.runtime import GraphSession
from bertserve.service.tokenization import EncodedInput
from bertserve.v1 import inference_pb2 as pb

if TYPE_CHECKING:
    from bertserve.service.served_model import ServedModel

ATTENTIONS_OUTPUT = "attentions"
# Protobuf bytes per token in the response besides the maps (text, id, offsets, flags, framing): a bound.
TOKEN_BYTES = 64
FRAMING_BYTES = 1024


def select_indices(values: Sequence[int], limit: int, field: str, model: str) -> list[int]:
    """The requested layers (or heads), in request order; empty: all of them. Each failure names the field."""
    if not values:
        return list(range(limit))
    seen: set[int] = set()
    for i, value in enumerate(values):
        if value >= limit:
            raise InvalidInput(
                f"{field}[{i}]: {value} is out of range: model {model} has {limit} {field} (0 to {limit - 1})"
            )
        if value in seen:
            raise InvalidInput(f"{field}[{i}]: {value} is listed twice")
        seen.add(value)
    return list(values)


def check_response_size(maps: int, length: int, max_message_bytes: int) -> None:
    """Refuses, before any compute, a response that would not fit in a gRPC message."""
    size = maps * (4 * length * length + 16) + TOKEN_BYTES * length + FRAMING_BYTES
    if size > max_message_bytes:
        raise InvalidInput(
            f"layers, heads: {maps} maps of {length} x {length} probabilities need about {size} bytes, "
            f"more than max_message_bytes {max_message_bytes}; ask for fewer layers or heads"
        )


@dataclass(frozen=True)
class AttentionResult:
    maps: np.ndarray  # (len(layers), len(heads), T, T) float32
    queue_s: float  # from submission until the worker thread took it
    inference_s: float


class AttentionGraph:
    def __init__(self, session: GraphSession, model: str):
        self.session = session
        self.model = model

    @property
    def provider(self) -> str:
        return self.session.provider

    def run(self, ids: np.ndarray, type_ids: np.ndarray, layers: list[int], heads: list[int]) -> np.ndarray:
        """Blocking. ids, type_ids: (T,) int64 of one input -> (len(layers), len(heads), T, T)."""
        feeds = {
            "input_ids": ids[None, :],  # (1, T)
            "attention_mask": np.ones((1, ids.shape[0]), dtype=np.int64),  # (1, T)
            "token_type_ids": type_ids[None, :],  # (1, T)
        }
        attentions = self.session.run(feeds, [ATTENTIONS_OUTPUT])[ATTENTIONS_OUTPUT]  # (L, 1, H, T, T)
        return attentions[np.ix_(layers, [0], heads)][:, 0]  # (l, h, T, T)

    def compute(
        self,
        ids: np.ndarray,
        type_ids: np.ndarray,
        layers: list[int],
        heads: list[int],
        submitted_at: float,
    ) -> AttentionResult:
        """Blocking; runs on the model's worker thread. ORT failures become InferenceFailed."""
        started = time.monotonic()
        try:
            maps = self.run(ids, type_ids, layers, heads)
        except Exception as exc:
            raise InferenceFailed(f"model {self.model}: the attention graph failed: {exc}") from None
        return AttentionResult(maps, started - submitted_at, time.monotonic() - started)


def attention_response(
    model: ServedModel,
    encoded: EncodedInput,
    layers: list[int],
    heads: list[int],
    result: AttentionResult,
    tokenize_s: float,
) -> pb.AttentionResponse:
    length = encoded.length
    dims = model.manifest.dimensions
    maps = [
        pb.AttentionMap(layer=layer, head=head, probabilities=result.maps[i, j].reshape(-1).tolist())
        for i, layer in enumerate(layers)
        for j, head in enumerate(heads)
    ]
    tokens = [
        pb.Token(text=text, id=int(token_id), start=start, end=end, special=special)
        for text, token_id, (start, end), special in zip(
            encoded.tokens, encoded.ids, encoded.offsets, encoded.special, strict=True
        )
    ]
    metadata = pb.ResponseMetadata(
        model=model.name,
        model_version=model.version,
        total_tokens=length,
        input_tokens=[length],
        truncated=[encoded.truncated],
        queue_time_ms=1000 * result.queue_s,
        inference_time_ms=1000 * result.inference_s,
        tokenize_time_ms=1000 * tokenize_s,
        batches=1,
    )
    return pb.AttentionResponse(
        tokens=tokens,
        sequence_length=length,
        num_layers=dims.num_hidden_layers,
        num_heads=dims.num_attention_heads,
        maps=maps,
        metadata=metadata,
    )
