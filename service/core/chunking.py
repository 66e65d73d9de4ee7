"""Chunked embedding calls (`InferenceCore.embed(chunking=...)`): each text is tokenized whole, cut into
overlapping windows (service/engine/token_windows.py), each window embedded as its own input (its raw
pooled vector), and the windows' vectors pooled into one per text: "mean" weighted by each window's tokens,
or "max" elementwise. Then the call's dimensions and normalization apply, as to an unchunked vector.

Bounds: a text is at most max_input_chars characters (tokenized whole once); the windows of a call are at
most max_inputs_per_request, counted before any is built; their room in the queue is taken after the
texts' (a call refused for room costs no tokenization)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from bertserve.service.core.embed_inputs import left_truncation
from bertserve.service.core.embed_options import embed_result
from bertserve.service.core.prompts import call_prompt
from bertserve.service.core.results import EmbedResult, call_meta
from bertserve.service.core.task_calls import CHUNK_POOLINGS, Chunking, EmbedCall
from bertserve.service.core.validation import check_count
from bertserve.service.engine.tasks.embed import finish_embeddings
from bertserve.service.errors import InvalidInput

if TYPE_CHECKING:
    from bertserve.service.core.core import InferenceCore

MIN_WINDOW = 3  # [CLS], one token, [SEP]


def check_chunking(chunking: Chunking, max_length: int) -> tuple[int, int, str]:
    """(length, overlap, pooling) with defaults filled in; a bad field is refused by its name."""
    pooling = (chunking.pooling or "mean").lower()
    if pooling not in CHUNK_POOLINGS:
        raise InvalidInput(
            f"chunking.pooling: {chunking.pooling!r} is not one of {', '.join(CHUNK_POOLINGS)}"
        )
    length = chunking.length or max_length
    if not MIN_WINDOW <= length <= max_length:
        raise InvalidInput(
            f"chunking.length: {length} is not between {MIN_WINDOW} and the model's max_length {max_length}"
        )
    if not 0 <= chunking.overlap < length - 2:
        raise InvalidInput(
            f"chunking.overlap: {chunking.overlap} must be at least 0 and less than chunking.length - 2 "
            f"({length - 2})"
        )
    return length, chunking.overlap, pooling


def pool_windows(vectors: np.ndarray, tokens: np.ndarray, pooling: str) -> np.ndarray:
    """One text's window vectors (windows, dim) pooled: mean weighted by `tokens` per window, or max."""
    if pooling == "max":
        return vectors.max(axis=0)
    weights = tokens.astype(np.float64)
    return (vectors.astype(np.float64) * weights[:, None]).sum(axis=0) / weights.sum()


async def embed_chunked(
    core: InferenceCore,
    model: str,
    texts: Sequence[str],
    call: EmbedCall,
    chunking: Chunking,
    deadline: float | None,
    bulk: bool,
    prompt_name: str | None,
    truncation_direction: str,
    token_ids: Sequence[Sequence[int]] | None,
) -> EmbedResult:
    """The chunked path of `InferenceCore.embed` (see the module's docstring)."""
    if token_ids:
        raise InvalidInput("chunking: takes texts, not token_ids")
    if call.tokens or call.sparse or not call.dense:
        raise InvalidInput("chunking: dense vectors only (not with tokens or sparse)")
    left_truncation(truncation_direction)  # checked, though windows are never cut
    served = core._resolve(model, [call])
    option = core._options(served, call)  # the call's dimensions, encodings and normalize, checked
    raw = core._options(served, EmbedCall(normalize=False))  # each window's raw pooled vector
    length, overlap, pooling = check_chunking(chunking, served.manifest.max_length)
    prompt = call_prompt(served, prompt_name, True, False)
    settings = core.settings
    check_count(texts, settings.max_inputs_per_request)
    windows_per_text: list[int] = []

    async def tokenize():
        checked = core._check_texts(texts)  # each text within max_input_chars before its prompt
        checked = [prompt + text for text in checked] if prompt else checked
        core.metrics.tokenized_of(served.name).inc(len(checked))
        started = time.perf_counter()
        windows = await core.off_loop(
            served.tokenizer.windows, checked, length, overlap, settings.max_inputs_per_request
        )
        windows_per_text.extend(len(w) for w in windows)
        return [w for text in windows for w in text], time.perf_counter() - started

    encoded, tokenize_s, results = await core._admitted_run(
        served, [raw], len(texts), tokenize, deadline, bulk
    )
    pooled, tokens, start = [], [], 0
    for count in windows_per_text:
        mine = slice(start, start + count)
        lengths = np.array([e.length for e in encoded[mine]])
        pooled.append(pool_windows(np.stack([r.value for r in results[mine]]), lengths, pooling))
        tokens.append(int(lengths.sum()))
        start += count
    n = len(pooled)
    # the engine's own finish (dimensions, then normalize) and the result's encodings, as unchunked
    vectors = finish_embeddings(np.stack(pooled), np.full(n, option.normalize), np.full(n, option.dimensions))
    meta = call_meta(served, encoded, tokenize_s, results)
    meta = dataclasses.replace(meta, input_tokens=tokens, truncated=[False] * n)
    result = embed_result(served, call, option, vectors, meta)
    return dataclasses.replace(result, chunks=list(windows_per_text))
