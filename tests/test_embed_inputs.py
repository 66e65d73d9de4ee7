"""The input side of embedding calls through the inference core (service/core/core.py `embed`), on the tiny
sentence-transformers model of tests/embedding_models.py (prompts {"query": "query: ", "document":
"passage: "}, default "query", max_length 64): prompts by name against `SentenceTransformer.encode`, left
truncation against the tokenizer cut with truncation_side "left", token ids against the same text's ids,
auto_truncate, and every refusal naming its field."""

from __future__ import annotations

import numpy as np
import pytest

from bertserve.service.core.core import deadline_after
from bertserve.service.core.prompts import cohere_prompt_name
from bertserve.service.core.task_calls import EmbedCall
from bertserve.service.errors import InvalidInput
from tests.embedding_models import MAX_SEQ_LENGTH, PROMPTS, ST_MODEL

TEXTS = ["the cat sat on the mat", "a dog", "paris is the capital of a dog, or so they say"]
LONG = " ".join(f"word{i % 37} and, then" for i in range(200))  # far over max_length 64
MAX_INPUT_CHARS = 4000


@pytest.fixture(scope="module")
def st_server(st_repo):
    from tests.helpers.server import ServerThread

    with ServerThread(model_repo=st_repo, max_input_chars=MAX_INPUT_CHARS) as server:
        yield server


@pytest.fixture(scope="module")
def st(st_model_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(st_model_dir), device="cpu")


def embed(server, texts, **kwargs):
    core = server.server.core

    async def go():
        return await core.embed(ST_MODEL, texts, deadline=deadline_after(60), **kwargs)

    return server.call(go)


def close(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1e-5


@pytest.mark.parametrize("prompt_name", ["query", "document"])
def test_prompt_by_name_equals_sentence_transformers(st_server, st, prompt_name):
    got = embed(st_server, TEXTS, prompt_name=prompt_name)
    close(got.vectors, st.encode(TEXTS, prompt_name=prompt_name, normalize_embeddings=True))
    tokens = st.tokenizer([PROMPTS[prompt_name] + t for t in TEXTS])["input_ids"]
    assert got.meta.input_tokens == [len(ids) for ids in tokens]


def test_no_prompt_name_gets_the_default_prompt(st_server, st):
    got = embed(st_server, TEXTS)
    close(got.vectors, st.encode(TEXTS, normalize_embeddings=True))  # ST applies its default prompt too
    plain = st.encode(TEXTS, prompt="", normalize_embeddings=True)
    assert np.abs(got.vectors - plain).max() > 1e-3, "the prompt changes the vectors"


def test_unknown_prompt_and_prompt_with_token_ids_are_refused(st_server):
    with pytest.raises(InvalidInput, match=r"^prompt_name: 'passage' is not one of model tiny-st's prompts"):
        embed(st_server, TEXTS, prompt_name="passage")
    with pytest.raises(InvalidInput, match=r"\(document, query\)"):
        embed(st_server, TEXTS, prompt_name="nope")
    with pytest.raises(InvalidInput, match=r"^prompt_name: token_ids are used as given"):
        embed(st_server, [], token_ids=[[101, 102]], prompt_name="query")


def test_max_input_chars_is_checked_before_the_prompt(st_server):
    at_limit = ("abc " * MAX_INPUT_CHARS)[:MAX_INPUT_CHARS]
    got = embed(st_server, [at_limit], truncate=True, prompt_name="document")  # 9 more with the prompt
    assert got.meta.truncated == [True]
    with pytest.raises(InvalidInput, match=rf"inputs\[0\]: {MAX_INPUT_CHARS + 1} characters"):
        embed(st_server, [at_limit + "x"], truncate=True)


def test_cohere_input_type_maps_to_a_prompt_name():
    prompts = {"query": "q: ", "passage": "p: ", "classification": "c: "}
    assert cohere_prompt_name("search_query", prompts) == "query"
    assert cohere_prompt_name("search_document", prompts) == "passage"
    assert cohere_prompt_name("search_document", {"document": "d", "passage": "p"}) == "document"
    assert cohere_prompt_name("classification", prompts) == "classification"  # a prompt of that name
    assert cohere_prompt_name("clustering", {}) is None  # a model without prompts ignores it
    assert cohere_prompt_name(None, prompts) is None
    with pytest.raises(
        InvalidInput, match=r"^input_type: 'clustering' matches none .*classification, passage"
    ):
        cohere_prompt_name("clustering", prompts)


@pytest.mark.parametrize("direction", ["left", "Left", "LEFT"])
def test_left_truncation_equals_sentence_transformers_cut_on_the_left(st_server, st_model_dir, direction):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(st_model_dir), device="cpu")
    st.tokenizer.truncation_side = "left"
    texts = [LONG, TEXTS[0], LONG[:-300] + " the end"]
    got = embed(st_server, texts, truncate=True, truncation_direction=direction)
    close(got.vectors, st.encode(texts, normalize_embeddings=True))
    assert got.meta.truncated == [True, False, True]
    assert got.meta.input_tokens == [MAX_SEQ_LENGTH, len(st.tokenizer("query: " + TEXTS[0])["input_ids"]), 64]
    right = embed(st_server, texts, truncate=True, truncation_direction="right")
    assert np.abs(right.vectors[0] - got.vectors[0]).max() > 1e-3, "the two sides keep different tokens"


def test_left_truncation_ids_equal_transformers(st_server, st_model_dir):
    """The ids the graph reads: those of transformers' tokenizer(truncation_side="left", truncation=True)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(st_model_dir), truncation_side="left")
    texts = ["query: " + LONG, "query: " + LONG.replace(",", " ,,") + " 中文 [MASK] x"]
    expected = tokenizer(texts, truncation=True, max_length=MAX_SEQ_LENGTH)["input_ids"]
    served = st_server.server.core.registry.resolve(ST_MODEL, None)
    got = served.tokenizer.encode(texts, True, False, left=True)
    assert [g.ids.tolist() for g in got] == expected
    by_ids = embed(st_server, [], token_ids=expected)
    close(
        embed(
            st_server, [t.removeprefix("query: ") for t in texts], truncate=True, truncation_direction="left"
        ).vectors,
        by_ids.vectors,
    )


def test_a_bad_truncation_direction_is_refused(st_server):
    with pytest.raises(InvalidInput, match=r"^truncation_direction: 'middle' is not one of right, left"):
        embed(st_server, TEXTS, truncation_direction="middle")
    core = st_server.server.core

    async def pairs():
        return await core.infer(
            ST_MODEL, TEXTS[:1], [EmbedCall()], pairs=TEXTS[1:2], truncation_direction="left"
        )

    with pytest.raises(
        InvalidInput, match=r"^truncation_direction: sentence pairs are cut by truncation_strategy"
    ):
        st_server.call(pairs)


def test_token_ids_equal_the_same_texts(st_server, st):
    ids = st.tokenizer(["query: " + t for t in TEXTS])["input_ids"]
    by_text = embed(st_server, TEXTS)
    by_ids = embed(st_server, [], token_ids=ids)
    close(by_ids.vectors, by_text.vectors)
    assert by_ids.meta.input_tokens == by_text.meta.input_tokens and by_ids.meta.truncated == [False] * 3


@pytest.mark.parametrize("direction", ["right", "left"])
def test_long_token_ids_are_sliced_at_the_truncation_end(st_server, direction):
    ids = list(range(50, 150))
    got = embed(st_server, [], token_ids=[ids], truncate=True, truncation_direction=direction)
    kept = ids[-MAX_SEQ_LENGTH:] if direction == "left" else ids[:MAX_SEQ_LENGTH]
    close(got.vectors, embed(st_server, [], token_ids=[kept]).vectors)
    assert got.meta.truncated == [True] and got.meta.input_tokens == [MAX_SEQ_LENGTH]


def test_truncated_token_ids_are_read_only_as_far_as_kept(st_server):
    """With truncate, only the kept ids are read (and checked): a refusal names the id's place in the
    whole list; an id cut away is never read."""
    served = st_server.server.core.registry.resolve(ST_MODEL, None)
    vocab = served.manifest.dimensions.vocab_size
    ids = [5] * 100
    ids[90] = vocab
    with pytest.raises(InvalidInput, match=rf"^token_ids\[0\]\[90\]: {vocab} is outside the vocabulary"):
        embed(st_server, [], token_ids=[ids], truncate=True, truncation_direction="left")
    assert embed(st_server, [], token_ids=[ids], truncate=True).meta.truncated == [True]


def test_bad_token_ids_are_refused(st_server):
    served = st_server.server.core.registry.resolve(ST_MODEL, None)
    vocab = served.manifest.dimensions.vocab_size
    limits = st_server.server.core.settings
    cases = [
        (
            [[101, 102], [101, 7, 8, 9, 10, vocab, 102]],
            rf"^token_ids\[1\]\[5\]: {vocab} is outside the vocabulary \(size {vocab}\)",
        ),
        ([[101, -1]], r"^token_ids\[0\]\[1\]: -1 is outside the vocabulary"),
        ([[101], []], r"^token_ids\[1\]: empty"),
        (
            [[5]] * (limits.max_inputs_per_request + 1),
            r"^token_ids: 257 lists is more than max_inputs_per_request 256",
        ),
        (
            [[5] * (MAX_INPUT_CHARS + 1)],
            rf"^token_ids\[0\]: {MAX_INPUT_CHARS + 1} ids is more than max_input_chars",
        ),
        ([[5] * 65], r"^token_ids\[0\]: 65 ids is more than the model's max_length 64 \(set truncate"),
    ]
    for token_ids, message in cases:
        with pytest.raises(InvalidInput, match=message):
            embed(st_server, [], token_ids=token_ids)
    with pytest.raises(InvalidInput, match=r"^token_ids: give either inputs or token_ids"):
        embed(st_server, ["a"], token_ids=[[5]])
    assert embed(st_server, ["still healthy"]).vectors.shape == (1, 48)


def test_auto_truncate_cuts_every_embed_input(st_server, monkeypatch):
    with pytest.raises(
        InvalidInput, match=r"^inputs\[0\]: \d+ tokens is more than the model's max_length 64"
    ):
        embed(st_server, [LONG])
    monkeypatch.setattr(st_server.server.core.settings, "auto_truncate", True)
    got = embed(st_server, [LONG, "short"])
    assert got.meta.truncated == [True, False] and got.meta.input_tokens[0] == MAX_SEQ_LENGTH
    close(got.vectors, embed(st_server, [LONG, "short"], truncate=True).vectors)
    left = embed(st_server, [LONG], truncation_direction="left")
    close(left.vectors, embed(st_server, [LONG], truncate=True, truncation_direction="left").vectors)
    assert embed(st_server, [], token_ids=[[5] * 100]).meta.truncated == [True]


def test_infer_takes_the_input_options_for_embed_calls(st_server):
    core = st_server.server.core

    async def go():
        return await core.infer(
            ST_MODEL,
            [LONG],
            [EmbedCall()],
            truncate=True,
            prompt_name="document",
            truncation_direction="left",
        )

    (got,) = st_server.call(go)
    close(
        got.vectors,
        embed(st_server, [LONG], truncate=True, prompt_name="document", truncation_direction="left").vectors,
    )
