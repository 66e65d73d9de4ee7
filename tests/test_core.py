"""The inference core's typed API (service/core/core.py), called directly on a running server's event loop: the
methods every front builds on. (The fronts' own tests cover the wire formats.)"""

from __future__ import annotations

import time

import numpy as np
import pytest

from bertserve.service.core.core import deadline_after
from bertserve.service.core.results import ClassifyResult, EmbedResult, FillMaskResult
from bertserve.service.core.task_calls import ClassifyCall, EmbedCall
from bertserve.service.errors import InvalidInput, ModelNotFound, TaskUnavailable

TEXTS = ["the cat sat on the mat", "a dog", "paris is the capital of a dog"]


def run(server, method: str, *args, **kwargs):
    core = server.server.core

    async def go():
        return await getattr(core, method)(*args, **kwargs)

    return server.call(go)


def test_embed_returns_vectors_and_true_metadata(tiny_server):
    result = run(tiny_server, "embed", "tiny-embed", TEXTS, normalize=True, deadline=deadline_after(30))
    assert isinstance(result, EmbedResult)
    assert result.vectors.shape == (3, 48) and result.vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(result.vectors, axis=1), 1, atol=1e-5)
    meta = result.meta
    assert (meta.model, meta.version, meta.encoder) == ("tiny-embed", 1, "tiny-embed")
    assert meta.total_tokens == sum(meta.input_tokens) and meta.truncated == [False] * 3
    assert meta.batches >= 1 and meta.inference_s > 0 and meta.queue_s >= 0 and meta.tokenize_s > 0


def test_infer_runs_several_tasks_from_one_tokenization(tiny_server):
    embed, classify = run(
        tiny_server, "infer", "tiny-classifier", TEXTS, [EmbedCall(), ClassifyCall(top_k=2)]
    )
    assert isinstance(embed, EmbedResult) and isinstance(classify, ClassifyResult)
    assert embed.meta.input_tokens == classify.meta.input_tokens
    alone = run(tiny_server, "classify", "tiny-classifier", TEXTS, top_k=2)
    assert [[s.index for s in row] for row in classify.labels] == [
        [s.index for s in row] for row in alone.labels
    ]
    assert all(len(row) == 2 for row in classify.labels)


def test_fill_mask_typed_candidates(tiny_server):
    result = run(tiny_server, "fill_mask", "tiny-mlm", ["the [MASK] sat on the [MASK]"], top_k=3)
    assert isinstance(result, FillMaskResult)
    (masks,) = result.masks
    assert [m.position for m in masks] == [2, 6]
    for mask in masks:
        assert len(mask.tokens) == len(mask.sequences) == len(mask.token_ids) == 3
        assert list(mask.scores) == sorted(mask.scores, reverse=True)
    bare = run(tiny_server, "fill_mask", "tiny-mlm", ["the [MASK] sat"], sequences=False)
    assert bare.masks[0][0].sequences is None


def test_embed_stream_answers_chunks_in_order(tiny_server):
    chunks = [TEXTS[:1], TEXTS, TEXTS[1:]] * 3

    async def source():
        for chunk in chunks:
            yield chunk

    async def collect():
        return [r async for r in tiny_server.server.core.embed_stream("tiny-embed", source(), window=2)]

    results = tiny_server.call(collect)
    whole = run(tiny_server, "embed", "tiny-embed", TEXTS).vectors
    assert [len(r.vectors) for r in results] == [len(c) for c in chunks]
    for chunk, result in zip(chunks, results, strict=True):
        expected = whole[[TEXTS.index(t) for t in chunk]]
        assert np.abs(result.vectors - expected).max() <= 1e-5


@pytest.mark.parametrize(
    ("method", "args", "kwargs", "error", "needle"),
    [
        ("embed", ("no-such-model", TEXTS), {}, ModelNotFound, "no-such-model"),
        ("fill_mask", ("tiny-embed", TEXTS), {}, TaskUnavailable, "fill_mask"),
        ("embed", ("tiny-embed", [""]), {}, InvalidInput, "inputs[0]"),
        ("classify", ("tiny-classifier", TEXTS), {"top_k": 9}, InvalidInput, "top_k"),
        ("attention", ("tiny-embed", "a cat"), {"layers": [5]}, InvalidInput, "layers[0]"),
        ("model_info", ("nope",), {}, ModelNotFound, "nope"),
    ],
)
def test_domain_errors(tiny_server, method, args, kwargs, error, needle):
    core = tiny_server.server.core

    async def go():
        result = getattr(core, method)(*args, **kwargs)
        return await result if hasattr(result, "__await__") else result

    with pytest.raises(error, match=None) as caught:
        tiny_server.call(go)
    assert needle in str(caught.value)


def test_attention_and_info(tiny_server):
    result = run(tiny_server, "attention", "tiny-embed", "the cat sat", heads=[2, 0])
    length = result.tokens.length
    assert result.maps.shape == (2, 2, length, length) and result.heads == [2, 0]
    assert np.allclose(result.maps.sum(-1), 1, atol=1e-5)
    assert result.meta.batches == 1 and result.meta.inference_s > 0
    info = tiny_server.server.core.info()
    by_name = {m.name: m for m in info.models}
    assert by_name["tiny-mlm"].encoder == "tiny-mlm" and "attention" in by_name["tiny-embed"].tasks
    assert info.limits.max_queue_attention == tiny_server.settings.max_queue_attention
    assert deadline_after(None) is None and deadline_after(1.0) > time.monotonic()


def test_short_calls_are_tokenized_on_the_loop_and_longer_ones_on_the_cpu_pool(tiny_server, monkeypatch):
    """INLINE_TOKENIZE_CHARS bounds the event-loop time a call's tokenization may take."""
    import threading

    from bertserve.service.core.tokenizing import INLINE_TOKENIZE_CHARS

    tokenizer = tiny_server.server.core.registry.resolve("tiny-embed", None).tokenizer
    on_loop = []
    original = tokenizer.encode

    def spy(texts, truncate, detailed=True, left=False):
        on_loop.append(threading.current_thread().name)
        return original(texts, truncate, detailed, left)

    monkeypatch.setattr(tokenizer, "encode", spy)
    loop_thread = tiny_server.call(lambda: _thread_name())
    short, long = "a" * (INLINE_TOKENIZE_CHARS // 2), "a " * INLINE_TOKENIZE_CHARS
    run(tiny_server, "embed", "tiny-embed", [short, short], truncate=True)  # exactly at the limit
    run(tiny_server, "embed", "tiny-embed", [long], truncate=True)
    assert on_loop[0] == loop_thread
    assert on_loop[1] != loop_thread


def test_only_tokenize_and_attention_ask_the_tokenizer_for_tokens_and_offsets(tiny_server, monkeypatch):
    """Embed (and every call that only runs the graph) tokenizes for the graph alone; Tokenize still
    answers token strings and offsets."""
    tokenizer = tiny_server.server.core.registry.resolve("tiny-embed", None).tokenizer
    asked = []
    original = tokenizer.encode

    def spy(texts, truncate, detailed=True, left=False):
        asked.append(detailed)
        return original(texts, truncate, detailed, left)

    monkeypatch.setattr(tokenizer, "encode", spy)
    run(tiny_server, "embed", "tiny-embed", ["hello world"])
    tokenized = run(tiny_server, "tokenize", "tiny-embed", ["hello world"])
    assert asked == [False, True]
    (tokens,) = tokenized.inputs
    assert tokens.tokens[0] == "[CLS]" and tokens.offsets[1] == (0, 1) and tokens.offsets[-2][1] == 11


async def _thread_name():
    import threading

    return threading.current_thread().name
