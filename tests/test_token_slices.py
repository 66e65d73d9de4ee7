"""A large call's texts tokenized in slices on several threads (service/core/token_slices.py): the same
inputs, cuts and refusals as one `ModelTokenizer.encode`, slices of about the same characters, the pool's
threads used, and a pool busy elsewhere never waited on."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from bertserve.service.core import token_slices
from bertserve.service.core.token_slices import MIN_SLICE_CHARS, encode_sliced, slice_bounds
from bertserve.service.engine.tokenization import ModelTokenizer
from bertserve.service.errors import InvalidInput
from tests.test_tokenization_bounded import random_texts, spec, tokenizer_files


@pytest.fixture(scope="module")
def minilm(make_tiny_checkpoint) -> ModelTokenizer:
    path = tokenizer_files(make_tiny_checkpoint)["minilm"]
    return ModelTokenizer(path, spec(path), 40)


def _same(got, expected, detailed: bool = False) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert (g.ids.tolist(), g.type_ids.tolist(), g.truncated) == (
            e.ids.tolist(),
            e.type_ids.tolist(),
            e.truncated,
        )
        if detailed:
            assert (g.tokens, g.offsets) == (e.tokens, e.offsets)


def test_slices_are_contiguous_non_empty_and_balanced():
    assert slice_bounds([10] * 10, 3) == [0, 3, 7, 10]
    assert slice_bounds([1000, 1, 1, 1, 1000], 2) == [0, 3, 5]
    for lengths, slices in (([5, 1, 1], 3), ([1, 1, 900], 3), ([900, 1, 1], 3), ([3] * 7, 7)):
        bounds = slice_bounds(lengths, slices)
        assert bounds[0] == 0 and bounds[-1] == len(lengths) and len(bounds) == slices + 1
        assert all(a < b for a, b in zip(bounds, bounds[1:], strict=False)), (lengths, bounds)


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("detailed", [False, True])
def test_sliced_equals_one_encode(minilm, detailed, left):
    texts = random_texts(3) * 4  # some cut at max_length 40, some not
    assert sum(map(len, texts)) >= 4 * MIN_SLICE_CHARS
    with ThreadPoolExecutor(3) as pool:
        got = encode_sliced(minilm, texts, True, detailed, left, pool, 4)
    _same(got, minilm.encode(texts, True, detailed, left), detailed)
    assert any(e.truncated for e in got) and not all(e.truncated for e in got)


def test_a_call_that_does_not_truncate_is_refused_naming_its_first_cut_input(minilm):
    fits = ["short words here " * 2] * 200  # 6,800 characters, none cut
    long = "word " * 100
    texts = [*fits[:150], long, *fits[150:], long]
    with pytest.raises(InvalidInput) as serial:
        minilm.encode(texts, False)
    with ThreadPoolExecutor(3) as pool, pytest.raises(InvalidInput) as sliced:
        encode_sliced(minilm, texts, False, False, False, pool, 4)
    assert str(sliced.value) == str(serial.value) and "inputs[150]:" in str(sliced.value)
    with ThreadPoolExecutor(3) as pool:
        _same(encode_sliced(minilm, fits, False, False, True, pool, 4), minilm.encode(fits, False))


def test_the_pools_threads_tokenize_the_slices(minilm, monkeypatch):
    threads: list[str] = []
    encode = minilm.encode

    def recording(texts, *args):
        threads.append(threading.current_thread().name)
        return encode(texts, *args)

    monkeypatch.setattr(minilm, "encode", recording)
    texts = ["a sentence of some words, " * 8] * 40  # 8,320 characters: 4 slices of 2,080
    with ThreadPoolExecutor(3, thread_name_prefix="slices") as pool:
        encode_sliced(minilm, texts, True, False, False, pool, 4)
    assert len(threads) == 4 and threading.current_thread().name in threads
    assert sum(name.startswith("slices") for name in threads) >= 1
    threads.clear()
    encode_sliced(minilm, texts[:3], True, False, False, pool, 4)  # under MIN_SLICE_CHARS: one encode
    assert threads == [threading.current_thread().name]


def test_a_busy_pool_is_never_waited_on(minilm, monkeypatch):
    """The calling thread encodes every slice the pool has not started: with the pool's only thread held
    by other work, the call still ends."""
    release = threading.Event()
    texts = ["a sentence of some words, " * 8] * 40
    with ThreadPoolExecutor(1) as pool:
        pool.submit(release.wait)
        got = encode_sliced(minilm, texts, True, False, False, pool, 4)
        release.set()
    _same(got, minilm.encode(texts, True))


def test_unstarted_slices_are_encoded_before_waiting_on_a_started_one(minilm, monkeypatch):
    """The pool's only thread takes slice 1 and blocks until slice 3 is encoded: the caller encodes slices 2
    and 3 itself before it waits for slice 1 (waiting first would never end)."""
    texts = [f"text {k} " + "word " * 100 for k in range(12)]  # 4 slices of 3 texts
    third_done = threading.Event()
    encode = minilm.encode

    def encode_in_order(batch, *args):
        if batch[0].startswith("text 3 "):  # slice 1, on the pool's thread
            assert third_done.wait(10), "the caller waited on slice 1 first"
        out = encode(batch, *args)
        if batch[0].startswith("text 9 "):  # slice 3, on the calling thread
            third_done.set()
        return out

    monkeypatch.setattr(minilm, "encode", encode_in_order)
    with ThreadPoolExecutor(1) as pool:
        got = encode_sliced(minilm, texts, True, False, False, pool, 4)
    _same(got, encode(texts, True, False))


def test_tokenize_threads_setting(monkeypatch):
    from bertserve.service import settings as settings_module
    from bertserve.service.settings import load_settings

    monkeypatch.setattr(settings_module, "usable_cpus", lambda: 16)
    assert load_settings().tokenize_thread_count() == settings_module.AUTO_TOKENIZE_THREADS
    monkeypatch.setattr(settings_module, "usable_cpus", lambda: 2)
    assert load_settings().tokenize_thread_count() == 2
    assert load_settings(tokenize_threads=1).tokenize_thread_count() == 1
    with pytest.raises(settings_module.SettingsError, match="tokenize_threads"):
        load_settings(tokenize_threads=-1)
    assert token_slices.MIN_SLICE_CHARS == MIN_SLICE_CHARS
