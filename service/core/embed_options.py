"""Embed options checked against the model (dimensions, encodings, token-level and sparse outputs), the
answer's size bound before queueing, and the typed result built from the engine's per-row values."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bertserve.repository import EmbedTask
from bertserve.service.core.results import CallMeta, EmbedResult
from bertserve.service.core.task_calls import ENCODINGS, EmbedCall
from bertserve.service.engine.served_model import ServedModel
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.engine.tasks.embed import EmbedOutputs
from bertserve.service.engine.tasks.quantize import quantize
from bertserve.service.engine.tokenization import EncodedInput
from bertserve.service.errors import InvalidInput

CALIBRATED = ("int8", "uint8")  # encodings that need the model's calibration ranges
TOKEN_BYTES = 4  # a token-level answer: float32 per hidden value
SPARSE_ENTRY_BYTES = 8  # a sparse answer: an id and a weight per vocabulary entry, at worst every entry


def offered_encodings(task: EmbedTask | None) -> list[str]:
    """The encodings a model's dense vectors come in: int8/uint8 only with calibration ranges."""
    if task is None:
        return []
    return [e for e in ENCODINGS if e not in CALIBRATED or task.calibration_ranges]


def calibration_key(dimension: int, normalized: bool) -> str:
    return f"{dimension}:{'normalized' if normalized else 'raw'}"


def asked_encodings(call: EmbedCall) -> list[str]:
    """The call's encodings in order, once each, "float" when none."""
    return list(dict.fromkeys(call.encodings)) or ["float"]


def embed_options(model: ServedModel, call: EmbedCall, sparse_models: Sequence[str]) -> TaskOptions:
    """The call's embed options checked against `model` (InvalidInput naming the field otherwise), with the
    model's defaults filled in. `sparse_models`: the loaded models with an MLM head (named in a refusal)."""
    task = model.manifest.tasks.embed
    normalize = task.normalize if call.normalize is None else call.normalize
    if not (call.dense or call.tokens or call.sparse):
        raise InvalidInput("dense: ask for at least one of dense, tokens and sparse")
    dimension = call.dimensions or task.dimension
    allowed = sorted(set(task.dimensions))
    if dimension != task.dimension and dimension not in allowed:
        raise InvalidInput(
            f"dimensions: {dimension} is not one of the model's dimensions {allowed} (or {task.dimension})"
        )
    encodings = asked_encodings(call)
    for name in encodings:
        if name not in ENCODINGS:
            raise InvalidInput(f"encodings: {name!r} is not one of {', '.join(ENCODINGS)}")
    if not call.dense and encodings != ["float"]:
        raise InvalidInput(f"encodings: {', '.join(encodings)} encode the dense vector; set dense")
    key = calibration_key(dimension, normalize)
    if key not in task.calibration_ranges and (wrong := [e for e in encodings if e in CALIBRATED]):
        usable = [e for e in ENCODINGS if e not in CALIBRATED]
        keys = sorted(task.calibration_ranges)
        raise InvalidInput(
            f"encodings: {wrong[0]} needs calibration ranges for {key}, which model {model.name} lacks "
            f"(it has them for {keys}); here it offers {usable}"
        )
    if call.sparse:
        if model.manifest.tasks.fill_mask is None:
            raise InvalidInput(
                f"sparse: model {model.name} has no MLM head; loaded models with one: "
                f"{', '.join(sparse_models) or 'none'}"
            )
        if not (math.isfinite(call.sparse_threshold) and call.sparse_threshold >= 0):
            raise InvalidInput(
                f"sparse_threshold: must be a finite number at least 0 (got {call.sparse_threshold})"
            )
    return TaskOptions(
        Task.EMBED,
        normalize=normalize,
        dimensions=0 if dimension == task.dimension else dimension,
        dense=call.dense,
        tokens=call.tokens,
        sparse=call.sparse,
        sparse_threshold=float(call.sparse_threshold),
    )


def check_embed_answer_size(
    model: ServedModel, options: Sequence[TaskOptions], encoded: list[EncodedInput], max_message_bytes: int
) -> None:
    """Refuses, after tokenizing and before queueing, token-level and sparse answers that could not fit
    in max_message_bytes: token-level is every token's hidden state, sparse at worst every vocabulary id."""
    dims = model.manifest.dimensions
    tokens = sum(e.length for e in encoded)
    size, fields = 0, []
    for option in options:
        if option.task is not Task.EMBED:
            continue
        if option.tokens:
            size += tokens * dims.hidden_size * TOKEN_BYTES
            fields.append(f"tokens ({tokens} tokens x hidden {dims.hidden_size} x {TOKEN_BYTES} bytes)")
        if option.sparse:
            size += len(encoded) * dims.vocab_size * SPARSE_ENTRY_BYTES
            fields.append(
                f"sparse ({len(encoded)} inputs x vocabulary {dims.vocab_size} x {SPARSE_ENTRY_BYTES} bytes)"
            )
    if size > max_message_bytes:
        raise InvalidInput(
            f"{', '.join(fields)}: the answer may need {size} bytes, more than max_message_bytes "
            f"{max_message_bytes}; send fewer or shorter inputs"
        )


def stacked(rows: list[np.ndarray]) -> np.ndarray:
    """(n, dimension): one input's row is viewed, not copied (most calls have one input)."""
    if len(rows) == 1:
        return rows[0].reshape(1, -1)
    return np.stack(rows) if rows else np.zeros((0, 0), np.float32)


def embed_result(
    model: ServedModel, call: EmbedCall, option: TaskOptions, values: list, meta: CallMeta
) -> EmbedResult:
    """The typed result from the engine's per-row values (a vector, or EmbedOutputs with more than dense)."""
    full = [v if isinstance(v, EmbedOutputs) else None for v in values]
    vectors = None
    encodings: dict[str, np.ndarray] = {}
    if option.dense:
        vectors = stacked([v if f is None else f.dense for v, f in zip(values, full, strict=True)])
        task = model.manifest.tasks.embed
        ranges = task.calibration_ranges.get(calibration_key(vectors.shape[1], option.normalize))
        for name in asked_encodings(call):
            if name != "float":
                calibration = np.array(ranges) if name in CALIBRATED else None
                encodings[name] = quantize(vectors, name, calibration)
    return EmbedResult(
        vectors,
        meta,
        encodings=encodings,
        tokens=[f.tokens for f in full] if option.tokens else None,
        sparse=[f.sparse for f in full] if option.sparse else None,
    )
