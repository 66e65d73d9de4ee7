"""Embed outputs across processes (`serve --workers N`): a real `Engine` on a Unix socket and a front core
linked to it (as tests/test_engine_link.py) answer what a core computing in-process answers: the per-row
values (vectors, EmbedOutputs with token-level and sparse arrays) travel pickled between the two."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bertserve.service.core.core import InferenceCore
from bertserve.service.core.remote_engine import EngineLink
from bertserve.service.core.task_calls import EmbedCall
from bertserve.service.engine import model_registry
from bertserve.service.engine.process import Engine
from bertserve.service.metrics import Metrics
from bertserve.service.settings import load_settings
from tests.embed_outputs_repo import make_options_repo
from tests.embedding_models import MLM_MODEL, ST_MODEL

TEXTS = ["the cat sat on the mat", "a dog", "paris is the capital of a dog"]
CALLS = {
    ST_MODEL: [
        EmbedCall(normalize=True, dimensions=8, encodings=("float", "float16", "int8", "uint8", "binary")),
        EmbedCall(normalize=False, dimensions=16, encodings=("ubinary",), tokens=True),
    ],
    MLM_MODEL: [EmbedCall(dense=False, sparse=True, tokens=True, sparse_threshold=0.05)],
}


async def _both(settings, address: str) -> tuple[list, list]:
    engine = Engine(settings, address, Metrics())
    await engine.start()
    serving = asyncio.ensure_future(engine.serve())
    cpu = ThreadPoolExecutor(2)
    link = EngineLink(address)
    registry = model_registry.load(settings, front=True)
    await link.connect({m.name: m.version for m in registry.ordered})
    front = InferenceCore(registry, settings, Metrics(), cpu, engine=link)
    local = InferenceCore(model_registry.load(settings), settings, Metrics(), cpu)
    await local.start()
    try:
        answers = []
        for core in (front, local):
            results = []
            for model, calls in CALLS.items():
                results += await core.infer(model, TEXTS, calls)
            answers.append(results)
    finally:
        await local.close()
        local.shutdown_threads()
        engine.stop()
        await serving
        front.shutdown_threads()
        link.close()
        cpu.shutdown()
    return answers[0], answers[1]


def test_embed_outputs_cross_processes(st_repo, tmp_path):
    repo = make_options_repo(st_repo, tmp_path)
    settings = load_settings(model_repo=repo, metrics_port=-1, http_port=-1)
    remote, local = asyncio.run(_both(settings, f"{tmp_path}/engine"))
    assert len(remote) == len(local) == 3
    for got, want in zip(remote, local, strict=True):
        assert (got.vectors is None) == (want.vectors is None)
        if want.vectors is not None:
            assert got.vectors.dtype == np.float32 and np.array_equal(got.vectors, want.vectors)
        assert set(got.encodings) == set(want.encodings)
        for name, array in want.encodings.items():
            assert got.encodings[name].dtype == array.dtype and np.array_equal(got.encodings[name], array)
        assert (got.tokens is None) == (want.tokens is None) and (got.sparse is None) == (want.sparse is None)
        for a, b in zip(got.tokens or [], want.tokens or [], strict=True):
            assert a.shape == b.shape and np.array_equal(a, b)
        for (ids, weights), (want_ids, want_weights) in zip(got.sparse or [], want.sparse or [], strict=True):
            assert np.array_equal(ids, want_ids) and np.array_equal(weights, want_weights)
    st_dense, st_tokens, mlm = remote
    assert st_dense.vectors.shape == (3, 8) and set(st_dense.encodings) == {
        "float16",
        "int8",
        "uint8",
        "binary",
    }
    assert (
        st_tokens.vectors.shape == (3, 16)
        and [len(t) for t in st_tokens.tokens] == st_tokens.meta.input_tokens
    )
    assert mlm.vectors is None and len(mlm.sparse) == 3 and all(len(ids) > 0 for ids, _ in mlm.sparse)
