"""Embed outputs at the inference core (service/core/embed_options.py, the engine's EMBED finish): Matryoshka
dimensions, quantized encodings, token-level and SPLADE sparse outputs, each compared with the reference
library on the same checkpoint; mixed options in one encoder run; the checks and size bounds."""

from __future__ import annotations

import numpy as np
import pytest

from bertserve.service.core.task_calls import ENCODINGS, EmbedCall
from bertserve.service.errors import InvalidInput
from tests.embed_outputs_repo import make_options_repo
from tests.embedding_models import MLM_MODEL, ST_MODEL
from tests.helpers.server import GatedBatches, ServerThread

TEXTS = ["the cat sat on the mat", "a dog", "paris is the capital of a dog and 7 cats"]


@pytest.fixture(scope="module")
def options_repo(st_repo, tmp_path_factory):
    return make_options_repo(st_repo, tmp_path_factory.mktemp("embed-outputs"))


@pytest.fixture(scope="module")
def server(options_repo):
    """Batches not split by the inputs' lengths (max_padding_ratio): a call's inputs share one batch."""
    with ServerThread(model_repo=options_repo, max_queue_delay_ms=5, max_padding_ratio=1000) as server:
        yield server


def embed(server, model: str, texts, call: EmbedCall, **kwargs):
    core = server.server.core

    async def go():
        return await core.embed(model, texts, call=call, **kwargs)

    return server.call(go)


def infer(server, model: str, texts, calls):
    core = server.server.core

    async def go():
        return await core.infer(model, texts, calls)

    return server.call(go)


def manifest_ranges(server, key: str) -> np.ndarray:
    model = server.server.core.registry.by_name[ST_MODEL]
    return np.array(model.manifest.tasks.embed.calibration_ranges[key])


@pytest.mark.parametrize("dimensions", [8, 16, None])
def test_dimensions_equal_sentence_transformers_truncate_dim(server, st_model_dir, dimensions):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(st_model_dir), device="cpu")
    expected = st.encode(TEXTS, prompt="", truncate_dim=dimensions, normalize_embeddings=True)
    result = embed(server, ST_MODEL, TEXTS, EmbedCall(normalize=True, dimensions=dimensions))
    assert result.vectors.shape == expected.shape == (3, dimensions or 48)
    assert result.vectors.dtype == np.float32
    assert np.abs(result.vectors - expected).max() <= 1e-5
    assert result.encodings == {} and result.tokens is None and result.sparse is None


@pytest.mark.parametrize(("dimensions", "normalize"), [(8, True), (16, False), (None, True), (None, False)])
def test_encodings_equal_quantize_embeddings(server, dimensions, normalize):
    from sentence_transformers.util.quantization import quantize_embeddings

    call = EmbedCall(normalize=normalize, dimensions=dimensions, encodings=ENCODINGS)
    result = embed(server, ST_MODEL, TEXTS, call)
    vectors = result.vectors
    key = f"{vectors.shape[1]}:{'normalized' if normalize else 'raw'}"
    assert set(result.encodings) == set(ENCODINGS) - {"float"}
    assert np.array_equal(result.encodings["float16"], vectors.astype(np.float16))
    assert result.encodings["float16"].dtype == np.float16
    for precision in ("int8", "uint8", "binary", "ubinary"):
        expected = quantize_embeddings(vectors, precision, ranges=manifest_ranges(server, key))
        got = result.encodings[precision]
        assert got.dtype == expected.dtype and got.shape == expected.shape, precision
        assert np.array_equal(got, expected), precision
    assert result.encodings["binary"].shape == (3, (vectors.shape[1] + 7) // 8)
    # the fixed ranges are narrower than the vectors: both ends of the int8 scale are reached
    assert {0, 255} <= set(np.unique(result.encodings["uint8"]).tolist())


def test_tokens_equal_transformers_last_hidden_state(server, st_model_dir):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(st_model_dir))
    model = AutoModel.from_pretrained(str(st_model_dir)).eval()
    result = embed(server, ST_MODEL, TEXTS, EmbedCall(dense=False, tokens=True))
    assert result.vectors is None and result.encodings == {}
    for text, tokens, length in zip(TEXTS, result.tokens, result.meta.input_tokens, strict=True):
        with torch.no_grad():
            expected = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].numpy()
        assert tokens.shape == expected.shape == (length, 48) and tokens.dtype == np.float32
        assert np.abs(tokens - expected).max() <= 1e-5


def _splade(checkpoint, texts) -> list[np.ndarray]:
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    model = AutoModelForMaskedLM.from_pretrained(str(checkpoint)).eval()
    out = []
    for text in texts:
        with torch.no_grad():
            logits = model(**tokenizer(text, return_tensors="pt")).logits[0]  # (T, V)
        out.append(torch.log1p(torch.relu(logits)).max(dim=0).values.numpy())
    return out


def _threshold_between_values(weights: list[np.ndarray]) -> float:
    """A threshold near the median weight, in the middle of the widest gap there (away from any tie)."""
    values = np.unique(np.concatenate(weights))
    middle = np.searchsorted(values, np.median(values))
    near = values[max(middle - 20, 0) : middle + 20]
    gap = int(np.argmax(np.diff(near)))
    assert near[gap + 1] - near[gap] > 1e-4
    return float((near[gap] + near[gap + 1]) / 2)


def test_sparse_equals_splade_over_transformers_masked_lm(server, make_tiny_checkpoint):
    expected = _splade(make_tiny_checkpoint("BertForMaskedLM"), TEXTS)
    threshold = _threshold_between_values(expected)
    result = embed(server, MLM_MODEL, TEXTS, EmbedCall(dense=False, sparse=True, sparse_threshold=threshold))
    assert result.vectors is None and result.tokens is None
    for (ids, weights), full in zip(result.sparse, expected, strict=True):
        want = np.flatnonzero(full > threshold)
        assert ids.dtype == np.int64 and weights.dtype == np.float32
        assert 0 < len(want) < len(full) and np.array_equal(ids, want)
        assert np.abs(weights - full[want]).max() <= 1e-5
    zero = embed(server, MLM_MODEL, TEXTS[:1], EmbedCall(dense=False, sparse=True)).sparse[0]
    assert np.array_equal(zero[0], np.flatnonzero(expected[0] > 0))


def test_sparse_runs_the_mlm_head_in_bounded_pieces(server, monkeypatch):
    """SPARSE_LOGITS_BYTES bounds the rows of one MLM-head run, whatever the batch's tokens."""
    from bertserve.service.engine.tasks import sparse

    model = server.server.core.registry.by_name[MLM_MODEL]
    call = EmbedCall(dense=False, sparse=True)
    whole = embed(server, MLM_MODEL, TEXTS, call)
    rows_seen = []
    run = model.mlm_head.run

    def counted(feeds, outputs):
        rows_seen.append(len(feeds["hidden_states"]))
        return run(feeds, outputs)

    monkeypatch.setattr(model.mlm_head, "run", counted)
    monkeypatch.setattr(sparse, "SPARSE_LOGITS_BYTES", 3 * 4 * model.manifest.dimensions.vocab_size)
    pieces = embed(server, MLM_MODEL, TEXTS, call)
    assert rows_seen and max(rows_seen) <= 3
    assert sum(rows_seen) == sum(pieces.meta.input_tokens)
    for (ids, weights), (want_ids, want_weights) in zip(pieces.sparse, whole.sparse, strict=True):
        assert np.array_equal(ids, want_ids) and np.allclose(weights, want_weights, atol=1e-6)


def _spy_encoder_runs(monkeypatch, group) -> list[list[str]]:
    wanted = []
    for session in group.sessions:
        run = session.run

        def spied(feeds, outputs, captured=False, run=run):
            wanted.append(list(outputs))
            return run(feeds, outputs, captured)

        monkeypatch.setattr(session, "run", spied)
    return wanted


def test_one_call_with_mixed_outputs_is_one_encoder_run(server, monkeypatch):
    calls = [
        EmbedCall(normalize=True, encodings=("float", "binary")),
        EmbedCall(dense=False, tokens=True),
        EmbedCall(normalize=False, tokens=True, sparse=True, sparse_threshold=0.01),
    ]
    singles = [infer(server, MLM_MODEL, TEXTS, [c])[0] for c in calls[1:]]
    group = server.server.core.registry.by_name[MLM_MODEL].encoder
    wanted = _spy_encoder_runs(monkeypatch, group)
    dense, tokens, both = infer(server, MLM_MODEL, TEXTS, calls)
    assert len(wanted) == 1 and set(wanted[0]) == {"sentence_embedding", "last_hidden_state"}
    assert dense.meta.batches == tokens.meta.batches == both.meta.batches == 1
    assert dense.vectors.shape == (3, 48) and dense.tokens is None and set(dense.encodings) == {"binary"}
    assert both.vectors.shape == (3, 48)
    for a, b, c in zip(tokens.tokens, both.tokens, singles[0].tokens, strict=True):
        assert np.array_equal(a, b) and np.abs(a - c).max() <= 1e-5
    for (ids, weights), (want_ids, want_weights) in zip(both.sparse, singles[1].sparse, strict=True):
        assert np.array_equal(ids, want_ids) and np.abs(weights - want_weights).max() <= 1e-5
    wanted.clear()
    infer(server, MLM_MODEL, TEXTS, calls[:1])  # dense alone: the graph is asked for the pooled vector only
    assert wanted == [["sentence_embedding"]]


def test_calls_with_different_options_share_a_batch(server):
    """Two calls, one dense and one token-level and sparse, queued while a batch computes: the next batch
    holds both calls' inputs and each gets its own outputs."""
    core = server.server.core
    model = core.registry.by_name[MLM_MODEL]
    batches: list[list] = []
    with GatedBatches(model) as gate:
        compute = gate._compute
        gate._compute = lambda batch: (batches.append([item.options for item in batch]), compute(batch))[1]

        async def go():
            import asyncio

            first = asyncio.ensure_future(core.embed(MLM_MODEL, ["held at the gate"]))
            while not gate.computing.is_set():
                await asyncio.sleep(0.005)
            dense = asyncio.ensure_future(
                core.embed(MLM_MODEL, ["the cat sat"], call=EmbedCall(dimensions=None))
            )
            sparse = asyncio.ensure_future(
                core.embed(MLM_MODEL, ["the cat sat"], call=EmbedCall(tokens=True, sparse=True))
            )
            while model.batcher.depth < 2:
                await asyncio.sleep(0.005)
            gate.release()
            return await first, await dense, await sparse

        _, dense, sparse = server.call(go)
    assert len(batches) == 2 and len(batches[1]) == 2
    assert {(o.tokens, o.sparse) for o in batches[1]} == {(False, False), (True, True)}
    assert dense.tokens is None and len(sparse.tokens) == 1 and len(sparse.sparse) == 1
    assert np.abs(dense.vectors - sparse.vectors).max() <= 1e-6


@pytest.mark.parametrize(
    ("model", "call", "needle"),
    [
        (
            ST_MODEL,
            EmbedCall(dimensions=100),
            "dimensions: 100 is not one of the model's dimensions [8, 16] (or 48)",
        ),
        (ST_MODEL, EmbedCall(dimensions=-1), "dimensions: -1"),
        (
            ST_MODEL,
            EmbedCall(sparse=True),
            f"sparse: model {ST_MODEL} has no MLM head; loaded models with one: {MLM_MODEL}",
        ),
        (ST_MODEL, EmbedCall(encodings=("int4",)), "encodings: 'int4' is not one of float, float16"),
        (
            MLM_MODEL,
            EmbedCall(encodings=("uint8",)),
            "encodings: uint8 needs calibration ranges for 48:normalized",
        ),
        (ST_MODEL, EmbedCall(dense=False), "dense: ask for at least one of dense, tokens and sparse"),
        (ST_MODEL, EmbedCall(dense=False, tokens=True, encodings=("binary",)), "encodings: binary encode"),
        (MLM_MODEL, EmbedCall(sparse=True, sparse_threshold=float("nan")), "sparse_threshold: must be"),
        (MLM_MODEL, EmbedCall(sparse=True, sparse_threshold=-1.0), "sparse_threshold: must be"),
    ],
)
def test_options_the_model_lacks_are_refused_naming_the_field(server, model, call, needle):
    with pytest.raises(InvalidInput) as caught:
        embed(server, model, TEXTS, call)
    assert needle in str(caught.value)


def test_info_reports_what_each_model_offers(server):
    core = server.server.core
    st, mlm = core.model_info(ST_MODEL), core.model_info(MLM_MODEL)
    assert st.dimensions == [8, 16] and st.dimension == 48
    assert st.prompts == {"query": "query: ", "document": "passage: "} and st.default_prompt_name == ""
    assert st.encodings == list(ENCODINGS) and not st.sparse
    assert mlm.sparse and mlm.encodings == ["float", "float16", "binary", "ubinary"] and mlm.dimensions == []


@pytest.fixture(scope="module")
def small_server(options_repo):
    """max_message_bytes 16 KiB: 85 tokens of token-level output (hidden 48 x 4 bytes), 2 sparse answers
    (vocabulary 777 x 8 bytes)."""
    with ServerThread(
        model_repo=options_repo, max_queue_delay_ms=5, max_message_bytes=16384, max_padding_ratio=1000
    ) as server:
        yield server


def test_token_level_answer_is_bounded_before_queueing(small_server, monkeypatch):
    group = small_server.server.core.registry.by_name[MLM_MODEL].encoder
    wanted = _spy_encoder_runs(monkeypatch, group)
    long = " ".join(["a"] * 40)  # 42 tokens each: 2 x 42 x 48 x 4 = 16128 bytes fit; 3 inputs do not
    ok = embed(small_server, MLM_MODEL, [long, long], EmbedCall(dense=False, tokens=True))
    assert [len(t) for t in ok.tokens] == [42, 42] and len(wanted) == 1
    with pytest.raises(InvalidInput) as caught:
        embed(small_server, MLM_MODEL, [long] * 3, EmbedCall(dense=False, tokens=True))
    message = str(caught.value)
    assert (
        message.startswith("tokens (126 tokens x hidden 48 x 4 bytes)")
        and "max_message_bytes 16384" in message
    )
    assert len(wanted) == 1  # nothing was computed
    assert small_server.server.core.registry.by_name[MLM_MODEL].batcher.depth == 0


def test_sparse_answer_is_bounded_before_queueing(small_server, monkeypatch):
    group = small_server.server.core.registry.by_name[MLM_MODEL].encoder
    wanted = _spy_encoder_runs(monkeypatch, group)
    ok = embed(small_server, MLM_MODEL, TEXTS[:2], EmbedCall(dense=False, sparse=True))
    assert len(ok.sparse) == 2 and len(wanted) == 1
    with pytest.raises(InvalidInput) as caught:
        embed(small_server, MLM_MODEL, TEXTS, EmbedCall(dense=False, sparse=True))
    message = str(caught.value)
    assert (
        message.startswith("sparse (3 inputs x vocabulary 777 x 8 bytes)") and "max_message_bytes" in message
    )
    with pytest.raises(InvalidInput) as both:  # together: 1 input's sparse answer and its token rows
        embed(
            small_server,
            MLM_MODEL,
            [" ".join(["a"] * 60)],
            EmbedCall(dense=False, tokens=True, sparse=True),
        )
    assert str(both.value).startswith("tokens (62 tokens") and "sparse (1 inputs" in str(both.value)
    assert len(wanted) == 1


def test_sparse_from_a_tied_head_on_a_shared_encoder(shared_repo, make_tiny_checkpoint):
    """tiny-shared-mlm: a head-only model whose tied MLM head takes the shared encoder's table as an input."""
    from tests.conftest import SHARED_ENCODER

    checkpoint = make_tiny_checkpoint(
        "BertForMaskedLM", seed=1, encoder_from=make_tiny_checkpoint("BertModel")
    )
    expected = _splade(checkpoint, TEXTS)
    threshold = _threshold_between_values(expected)
    with ServerThread(model_repo=shared_repo, max_queue_delay_ms=5) as shared:
        call = EmbedCall(sparse=True, sparse_threshold=threshold)
        result = embed(shared, "tiny-shared-mlm", TEXTS, call)
        plain = embed(shared, SHARED_ENCODER, TEXTS, EmbedCall())
    assert result.meta.encoder == SHARED_ENCODER
    assert np.abs(result.vectors - plain.vectors).max() <= 1e-6  # the same encoder's pooled vectors
    for (ids, weights), full in zip(result.sparse, expected, strict=True):
        assert np.array_equal(ids, np.flatnonzero(full > threshold))
        assert np.abs(weights - full[ids]).max() <= 1e-5
