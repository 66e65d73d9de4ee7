"""Attention maps: one input through a model's `encoder_attentions` graph (fp32, unfused).

An Attention call holds one input and is not batched: the queue owner of the model's encoder admits it
(`Batcher.submit_exclusive`, limit `max_queue_attention`) and runs it on the encoder's worker thread, so
it never runs at the same time as batches and never competes with them for ONNX Runtime's threads; the
owner alternates, so a batch waits for at most one attention run. The graph outputs `attentions` (layers, batch, heads, sequence, sequence); the input is alone, so there is
no padding and every row is a real query token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bertserve.service.engine.runtime import EngineSession, GraphSession
from bertserve.service.errors import InferenceFailed, InvalidInput

ATTENTIONS_OUTPUT = "attentions"
# Protobuf bytes per token in the response besides the maps (text, id, offsets, flags, framing): a bound.
TOKEN_BYTES = 64
FRAMING_BYTES = 1024
PROTO_PROBABILITY_BYTES = 4  # a float32 in a packed repeated field


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


def check_response_size(
    maps: int,
    length: int,
    max_message_bytes: int,
    probability_bytes: int = PROTO_PROBABILITY_BYTES,
    token_bytes: int = TOKEN_BYTES,
) -> None:
    """Refuses, before any compute, a response that would not fit in a message: `probability_bytes` and
    `token_bytes` are what the reply's encoding spends on each (protobuf's by default; JSON's are larger)."""
    size = maps * (probability_bytes * length * length + 64) + token_bytes * length + FRAMING_BYTES
    if size > max_message_bytes:
        raise InvalidInput(
            f"layers, heads: {maps} maps of {length} x {length} probabilities need about {size} bytes "
            f"({probability_bytes} per probability), more than max_message_bytes {max_message_bytes}; "
            "ask for fewer layers or heads, or send a shorter input"
        )


class AttentionGraph:
    def __init__(self, session: GraphSession | EngineSession, model: str):
        self.session = session
        self.model = model

    @property
    def provider(self) -> str:
        return self.session.provider

    def run(self, ids: np.ndarray, type_ids: np.ndarray, layers: list[int], heads: list[int]) -> np.ndarray:
        """Blocking. ids, type_ids: (T,) int64 of one input -> (len(layers), len(heads), T, T) float32."""
        feeds = {
            "input_ids": ids[None, :],  # (1, T)
            "attention_mask": np.ones((1, ids.shape[0]), dtype=np.int64),  # (1, T)
            "token_type_ids": type_ids[None, :],  # (1, T)
        }
        attentions = self.session.run(feeds, [ATTENTIONS_OUTPUT])[ATTENTIONS_OUTPUT]  # (L, 1, H, T, T)
        return np.ascontiguousarray(attentions[np.ix_(layers, [0], heads)][:, 0], dtype=np.float32)

    def bind(
        self, ids: np.ndarray, type_ids: np.ndarray, layers: list[int], heads: list[int], model: str = ""
    ) -> AttentionRun:
        """The run as a job for the encoder's queue owner (blocking; ORT failures become InferenceFailed)."""
        return AttentionRun(self, ids, type_ids, layers, heads, model or self.model)


@dataclass(frozen=True)
class AttentionRun:
    """One attention run, as its queue owner runs it (a call), or as a front sends it to the engine (its
    fields)."""

    graph: AttentionGraph
    ids: np.ndarray  # (T,) int64
    type_ids: np.ndarray  # (T,) int64
    layers: list[int]
    heads: list[int]
    model: str

    def __call__(self) -> np.ndarray:
        try:
            return self.graph.run(self.ids, self.type_ids, self.layers, self.heads)
        except Exception as exc:
            raise InferenceFailed(f"model {self.model}: the attention graph failed: {exc}") from None
