"""Chunked embedding calls (service/core/chunking.py) through the inference core, on the tiny
sentence-transformers model (max_length 64, default prompt "query: "): each text tokenized whole, cut into
overlapping windows wrapped in [CLS] ... [SEP], each window's raw vector pooled. The expected vectors are
built independently: the windows' ids cut in Python from transformers' tokenization, embedded one by one as
token ids (normalize off), pooled in numpy, then cut and normalized."""

from __future__ import annotations

import numpy as np
import pytest

from bertserve.service.core.task_calls import Chunking, EmbedCall
from bertserve.service.errors import InvalidInput, Overloaded
from tests import test_embed_inputs
from tests.embedding_models import MAX_SEQ_LENGTH, ST_MODEL
from tests.test_embed_inputs import LONG, TEXTS, close, embed

st_server = test_embed_inputs.st_server  # the module's server fixture, one per module

PROMPT = "query: "


def windows_of(tokenizer, text: str, length: int, overlap: int) -> list[list[int]]:
    ids = tokenizer(PROMPT + text, add_special_tokens=False)["input_ids"]
    width, out, start = length - 2, [], 0
    while True:
        out.append([tokenizer.cls_token_id, *ids[start : start + width], tokenizer.sep_token_id])
        if start + width >= len(ids):
            return out
        start += width - overlap


def expected(server, tokenizer, text, length, overlap, pooling, dimensions=None, normalize=True):
    windows = windows_of(tokenizer, text, length, overlap)
    rows = np.concatenate(
        [embed(server, [], token_ids=[w], normalize=False).vectors for w in windows]
    ).astype(np.float64)
    if pooling == "mean":
        weights = np.array([len(w) for w in windows], dtype=np.float64)
        pooled = (rows * weights[:, None]).sum(axis=0) / weights.sum()
    else:
        pooled = rows.max(axis=0)
    pooled = pooled[:dimensions] if dimensions else pooled
    if normalize:
        pooled = pooled / np.linalg.norm(pooled)
    return pooled.astype(np.float32), windows


@pytest.fixture(scope="module")
def tokenizer(st_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(st_model_dir))


@pytest.mark.parametrize(
    ("length", "overlap", "pooling"), [(16, 4, "mean"), (16, 0, "max"), (0, 10, "mean"), (12, 3, "MAX")]
)
def test_chunked_vectors_equal_windows_embedded_one_by_one_and_pooled(
    st_server, tokenizer, length, overlap, pooling
):
    texts = [LONG, TEXTS[2], LONG[:500]]
    got = embed(st_server, texts, chunking=Chunking(length, overlap, pooling))
    window_length = length or MAX_SEQ_LENGTH
    for k, text in enumerate(texts):
        vector, windows = expected(st_server, tokenizer, text, window_length, overlap, pooling.lower())
        close(got.vectors[k : k + 1], vector[None])
        assert got.chunks[k] == len(windows)
        assert got.meta.input_tokens[k] == sum(len(w) for w in windows)
    assert got.chunks[0] > 1 and got.meta.truncated == [False] * 3


def test_chunked_vectors_take_dimensions_normalize_and_encodings(st_server, tokenizer):
    call = EmbedCall(dimensions=8, encodings=("float", "binary"))
    got = embed(st_server, [LONG], call=call, chunking=Chunking(20, 5, "mean"))
    vector, _ = expected(st_server, tokenizer, LONG, 20, 5, "mean", dimensions=8)
    close(got.vectors, vector[None])
    from sentence_transformers.util.quantization import quantize_embeddings

    assert got.encodings["binary"].tolist() == quantize_embeddings(got.vectors, "binary").tolist()
    raw = embed(st_server, [LONG], normalize=False, chunking=Chunking(20, 5, "max"))
    vector, _ = expected(st_server, tokenizer, LONG, 20, 5, "max", normalize=False)
    close(raw.vectors, vector[None])


def test_a_short_text_is_one_window_equal_to_the_unchunked_vector(st_server):
    got = embed(st_server, TEXTS, chunking=Chunking())
    assert got.chunks == [1, 1, 1]
    close(got.vectors, embed(st_server, TEXTS).vectors)
    assert got.meta.input_tokens == embed(st_server, TEXTS).meta.input_tokens


def test_bad_chunking_fields_are_refused(st_server):
    cases = [
        (Chunking(length=2), r"^chunking.length: 2 is not between 3 and the model's max_length 64"),
        (Chunking(length=65), r"^chunking.length: 65 is not between 3"),
        (
            Chunking(length=10, overlap=8),
            r"^chunking.overlap: 8 must be at least 0 and less than chunking.length - 2 \(8\)",
        ),
        (Chunking(overlap=-1), r"^chunking.overlap: -1"),
        (Chunking(pooling="median"), r"^chunking.pooling: 'median' is not one of mean, max"),
    ]
    for chunking, message in cases:
        with pytest.raises(InvalidInput, match=message):
            embed(st_server, [LONG], chunking=chunking)
    with pytest.raises(InvalidInput, match=r"^chunking: dense vectors only"):
        embed(st_server, [LONG], call=EmbedCall(tokens=True), chunking=Chunking())
    with pytest.raises(InvalidInput, match=r"^chunking: takes texts, not token_ids"):
        embed(st_server, [], token_ids=[[5, 6]], chunking=Chunking())
    with pytest.raises(InvalidInput, match=r"^truncation_direction: 'up'"):
        embed(st_server, [LONG], truncation_direction="up", chunking=Chunking())


def test_windows_over_max_inputs_per_request_are_refused(st_server, tokenizer, monkeypatch):
    windows = len(windows_of(tokenizer, LONG, 16, 0))
    monkeypatch.setattr(st_server.server.core.settings, "max_inputs_per_request", windows)
    assert embed(st_server, [LONG], chunking=Chunking(16)).chunks == [windows]
    with pytest.raises(
        InvalidInput,
        match=rf"^chunking: the inputs need more than {windows} windows, the limit max_inputs_per_request",
    ):
        embed(st_server, [LONG, "a"], chunking=Chunking(16))


def test_windows_take_their_room_in_the_queue(st_server, tokenizer, monkeypatch):
    """A chunked call's windows are inputs in the queue: room for them all, or the call is refused."""
    windows = len(windows_of(tokenizer, LONG, 16, 0))
    room = st_server.server.core.registry.resolve(ST_MODEL, None).encoder.batcher._room[False]
    monkeypatch.setattr(room, "limit", windows - 1)
    with pytest.raises(Overloaded):
        embed(st_server, [LONG], chunking=Chunking(16))
    assert room.used == 0, "the room taken is given back"
    monkeypatch.setattr(room, "limit", windows)
    assert embed(st_server, [LONG], chunking=Chunking(16)).chunks == [windows]


def test_stream_windows_wait_for_all_their_room_holding_none(st_server, tokenizer, monkeypatch):
    """Two streams' chunked requests whose windows fill the stream lane one at a time: each waits for all
    its room without holding its texts' share, so neither waits on the other forever."""
    import asyncio

    windows = len(windows_of(tokenizer, LONG, 16, 0))
    core = st_server.server.core
    room = core.registry.resolve(ST_MODEL, None).encoder.batcher._room[True]
    monkeypatch.setattr(room, "limit", windows)

    async def both():
        calls = [core.embed(ST_MODEL, [LONG], chunking=Chunking(16), bulk=True) for _ in range(2)]
        return await asyncio.wait_for(asyncio.gather(*calls), 60)

    results = st_server.call(both)
    assert [r.chunks for r in results] == [[windows], [windows]]
    close(results[0].vectors, results[1].vectors)
    assert room.used == 0
