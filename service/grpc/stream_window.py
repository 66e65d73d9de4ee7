"""An EmbedStream's window: its inputs in flight and the bytes its answers may take, both bounded.

A request takes room for its inputs and for its answer's worst case before it runs (`answer_reservation`:
a token-level or sparse answer can be thousands of times a vector's size), keeps room for its answer's
real size once built, and gives both back once that answer is sent. The reader reads the next request
only while both have room, so a stream whose client does not read holds at most
`max_stream_inputs_in_flight` inputs and `max_message_bytes` of answers (service/grpc/stream_memory.py);
a request that does not fit waits until the answers before it are sent, one larger than the window runs
alone.
"""

from __future__ import annotations

import asyncio
import math
from typing import NamedTuple

from bertserve.service.core.results import ModelInfo
from bertserve.service.grpc.embed_options import EmbedArguments

# Bytes per value of each dense encoding on the wire (binary ones pack 8 values a byte).
ENCODING_VALUE_BYTES = {
    "float": 4.0,
    "float16": 2.0,
    "int8": 1.0,
    "uint8": 1.0,
    "binary": 0.125,
    "ubinary": 0.125,
}
FIELD_BYTES = 16  # a field's tag and length, and an input's own framing, rounded up
SPARSE_ENTRY_BYTES = 9  # a vocabulary id (varint, at most 5 bytes) and its float32 weight


class StreamWindow:
    """Inputs in flight (at most `inputs`) and answer bytes reserved (at most `answer_bytes`); a request
    that does not fit runs when nothing else is in flight."""

    def __init__(self, inputs: int, answer_bytes: int):
        self.limit, self.answer_limit = inputs, answer_bytes
        self.in_flight = 0
        self.reserved = 0  # answer bytes
        self._changed = asyncio.Condition()

    def _fits(self, inputs: int, answer_bytes: int) -> bool:
        if self.in_flight == 0:
            return True
        return self.in_flight + inputs <= self.limit and self.reserved + answer_bytes <= self.answer_limit

    async def wait_room(self) -> None:
        async with self._changed:
            await self._changed.wait_for(
                lambda: self.in_flight < self.limit and self.reserved < self.answer_limit
            )

    async def acquire(self, inputs: int, answer_bytes: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._fits(inputs, answer_bytes))
            self.in_flight += inputs
            self.reserved += answer_bytes

    async def resize(self, reserved: int, actual: int) -> None:
        """An answer is built: it keeps room for its `actual` bytes instead of the `reserved` estimate."""
        async with self._changed:
            self.reserved += actual - reserved
            self._changed.notify_all()

    async def release(self, inputs: int, answer_bytes: int) -> None:
        async with self._changed:
            self.in_flight -= inputs
            self.reserved -= answer_bytes
            self._changed.notify_all()


def dense_answer_bytes(dimension: int, encodings: tuple[str, ...] = tuple(ENCODING_VALUE_BYTES)) -> int:
    """The most one input's pooled vector takes on the wire in `encodings` (all of them by default)."""
    values = sum(math.ceil(ENCODING_VALUE_BYTES.get(name, 4.0) * dimension) for name in encodings)
    return values + FIELD_BYTES * (len(encodings) + 1)


class AnswerShape(NamedTuple):
    """What sizes a model's answers: its vector's dimension (its hidden size), max_length, vocabulary."""

    dimension: int
    max_length: int
    vocab_size: int

    @classmethod
    def of(cls, models: list[ModelInfo]) -> AnswerShape:
        """The largest of each over `models`: a bound for a request whose model is not known yet."""
        return cls(
            max((m.dimension for m in models), default=0),
            max((m.max_length for m in models), default=0),
            max((m.vocab_size for m in models), default=0),
        )


def answer_reservation(arguments: EmbedArguments, model: AnswerShape, limit: int) -> int:
    """A request's answer at its worst, before it runs: every input at the model's max_length for token
    vectors, the whole vocabulary for sparse weights; at most `limit` (max_message_bytes: the most the
    server answers one request with)."""
    call = arguments.call
    per_input = FIELD_BYTES * 2  # an input's framing and chunk count
    if call.dense:
        per_input += dense_answer_bytes(call.dimensions or model.dimension, call.encodings)
    if call.sparse:
        per_input += SPARSE_ENTRY_BYTES * model.vocab_size + 2 * FIELD_BYTES
    total = arguments.inputs * per_input
    if call.tokens:
        row = 4 * model.dimension  # float32 per token, the hidden size (an embedding model's dimension)
        if arguments.token_ids is not None:  # cut to max_length at most
            tokens = sum(min(len(ids), model.max_length) for ids in arguments.token_ids)
        else:
            tokens = arguments.inputs * model.max_length
        total += tokens * row + arguments.inputs * 2 * FIELD_BYTES
    return min(total, limit)
