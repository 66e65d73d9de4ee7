"""The embed task's KServe v2 outputs and parameters, for both KServe fronts (gRPC servicer.py, REST
http_routes.py): which outputs a model has, the core's EmbedCall for the outputs a request names, and the
tensors of its result.

    embedding           FP32  [n, d]             the pooled vector (d: parameter "dimensions", else the model's)
    embedding_float16   FP16  [n, d]             its other encodings, as sentence-transformers'
    embedding_int8      INT8  [n, d]             quantize_embeddings (int8/uint8: models with calibration
    embedding_uint8     UINT8 [n, d]             ranges, see ModelMetadata)
    embedding_binary    INT8  [n, ceil(d / 8)]   packed bits
    embedding_ubinary   UINT8 [n, ceil(d / 8)]
    token_embeddings    FP32  [n, t, hidden]     every token's last hidden state, zero-padded to the
    token_lengths       INT32 [n]                longest input's t tokens; each input's token count
    sparse_indices      INT32 [n, k]             SPLADE (models with an MLM head): the ids whose weight is
    sparse_values       FP32  [n, k]             above parameter "sparse_threshold", ascending, padded to
    sparse_lengths      INT32 [n]                the most ids of an input with -1 and 0; ids per input

Parameters: "dimensions" (int64), "prompt_name" and "truncation_direction" (string), "sparse_threshold"
(double), with "normalize" and "truncate". Padded outputs are refused before they are built when they
would pass max_message_bytes (INVALID_ARGUMENT naming the output: send inputs of similar length, or fewer).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from bertserve.service.core.results import EmbedResult, ModelInfo
from bertserve.service.core.task_calls import EmbedCall
from bertserve.service.errors import InvalidInput
from bertserve.service.kserve.tensors import OutputTensor

DENSE = "embedding"
# encoding -> (output name, datatype)
ENCODED = {
    "float16": ("embedding_float16", "FP16"),
    "int8": ("embedding_int8", "INT8"),
    "uint8": ("embedding_uint8", "UINT8"),
    "binary": ("embedding_binary", "INT8"),
    "ubinary": ("embedding_ubinary", "UINT8"),
}
TOKENS, TOKEN_LENGTHS = "token_embeddings", "token_lengths"
SPARSE_INDICES, SPARSE_VALUES, SPARSE_LENGTHS = "sparse_indices", "sparse_values", "sparse_lengths"
SPARSE_OUTPUTS = (SPARSE_INDICES, SPARSE_VALUES, SPARSE_LENGTHS)
# the core's option names -> this protocol's fields
FIELDS = {
    "sparse_threshold": "parameters['sparse_threshold']",
    "truncation_direction": "parameters['truncation_direction']",
    "prompt_name": "parameters['prompt_name']",
    "dimensions": "parameters['dimensions']",
    "encodings": "outputs",
    "tokens": f"outputs[{TOKENS!r}]",
    "sparse": "outputs (sparse)",
}
_FIELD = re.compile(rf"({'|'.join(FIELDS)})(?![\w])")


def output_metadata(model: ModelInfo) -> list[tuple[str, str, list[int]]]:
    """(name, datatype, shape) of the model's embed outputs (-1: decided by the request)."""
    d = -1 if model.dimensions else model.dimension
    bits = -1 if model.dimensions else math.ceil(model.dimension / 8)
    outputs = [(DENSE, "FP32", [-1, d])]
    for encoding in model.encodings:
        if encoding in ENCODED:
            name, datatype = ENCODED[encoding]
            outputs.append((name, datatype, [-1, bits if "binary" in encoding else d]))
    outputs += [(TOKENS, "FP32", [-1, -1, model.dimension]), (TOKEN_LENGTHS, "INT32", [-1])]
    if model.sparse:
        outputs += [(SPARSE_INDICES, "INT32", [-1, -1]), (SPARSE_VALUES, "FP32", [-1, -1])]
        outputs.append((SPARSE_LENGTHS, "INT32", [-1]))
    return outputs


def output_names(model: ModelInfo) -> list[str]:
    return [name for name, _, _ in output_metadata(model)]


def embed_call(names: list[str], parameter: Callable[[str, type, object], object]) -> EmbedCall:
    """The core's call for the embed outputs among `names`; `parameter(name, kind, default)` reads a
    request parameter of that kind (bool, int, str, float)."""
    encodings = [e for e, (name, _) in ENCODED.items() if name in names]
    dense = DENSE in names or bool(encodings)
    tokens = TOKENS in names
    sparse = any(name in names for name in SPARSE_OUTPUTS)
    if DENSE in names or not encodings:
        encodings.insert(0, "float")
    dimensions = parameter("dimensions", int, None)
    if dimensions is not None and dimensions < 1:
        raise InvalidInput(
            f"parameters['dimensions']: {dimensions} is not a dimension; leave it out for the model's own"
        )
    return EmbedCall(
        normalize=parameter("normalize", bool, None),
        dimensions=dimensions,
        dense=dense or not (tokens or sparse),
        tokens=tokens,
        sparse=sparse,
        sparse_threshold=float(parameter("sparse_threshold", float, 0.0)),
        encodings=tuple(encodings),
    )


def embed_tensors(result: EmbedResult, names: list[str], max_bytes: int) -> dict[str, OutputTensor]:
    """The named embed outputs of a core result. Padded outputs over `max_bytes` are refused before they
    are built."""
    tensors: dict[str, OutputTensor] = {}
    if DENSE in names and result.vectors is not None:
        tensors[DENSE] = OutputTensor(DENSE, "FP32", result.vectors)
    for encoding, (name, datatype) in ENCODED.items():
        if name in names:
            tensors[name] = OutputTensor(name, datatype, result.encodings[encoding])
    lengths = np.asarray(result.meta.input_tokens, dtype=np.int32)
    if TOKEN_LENGTHS in names:
        tensors[TOKEN_LENGTHS] = OutputTensor(TOKEN_LENGTHS, "INT32", lengths)
    if TOKENS in names:
        rows = result.tokens or []
        longest = max((len(r) for r in rows), default=0)
        hidden = rows[0].shape[1] if rows else 0
        _check_padded(TOKENS, [len(rows), longest, hidden], 4, max_bytes)
        padded = np.zeros((len(rows), longest, hidden), np.float32)
        for i, row in enumerate(rows):
            padded[i, : len(row)] = row
        tensors[TOKENS] = OutputTensor(TOKENS, "FP32", padded)
    if any(name in names for name in SPARSE_OUTPUTS):
        rows = result.sparse or []
        most = max((len(ids) for ids, _ in rows), default=0)
        _check_padded("sparse_indices and sparse_values", [len(rows), most], 8, max_bytes)
        indices = np.full((len(rows), most), -1, np.int32)
        values = np.zeros((len(rows), most), np.float32)
        for i, (ids, weights) in enumerate(rows):
            indices[i, : len(ids)], values[i, : len(ids)] = ids, weights
        counts = np.array([len(ids) for ids, _ in rows], np.int32)
        for name, array, datatype in zip(
            SPARSE_OUTPUTS, (indices, values, counts), ("INT32", "FP32", "INT32"), strict=True
        ):
            if name in names:
                tensors[name] = OutputTensor(name, datatype, array)
    return tensors


def _check_padded(name: str, shape: list[int], item_bytes: int, max_bytes: int) -> None:
    size = math.prod(shape) * item_bytes
    if size > max_bytes:
        raise InvalidInput(
            f"outputs[{name!r}]: padded to {shape} they take {size} bytes, more than max_message_bytes "
            f"{max_bytes}; send inputs of similar length, or fewer per request"
        )


@contextmanager
def fields_named() -> Iterator[None]:
    """Within: the core's InvalidInput about an embed option names it as this protocol does."""
    try:
        yield
    except InvalidInput as exc:
        message = str(exc)
        match = _FIELD.match(message)
        if match is None:
            raise
        raise InvalidInput(FIELDS[match.group(1)] + message[match.end() :]) from None
