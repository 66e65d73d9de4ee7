"""The simulated device (setting `simulated_device_ms`): a real server whose encoder graphs answer each batch
with correctly shaped constant outputs after a fixed sleep, and whose heads still run for real."""

from __future__ import annotations

import numpy as np
import pytest

from bertserve.client import Client
from bertserve.service.engine.simulated_device import SIMULATED
from tests.helpers.server import ServerThread, metric, scrape

DEVICE_MS = 20.0
TEXTS = ["the cat sat on the mat", "paris is the capital of a dog", "a"]


@pytest.fixture(scope="module")
def simulated(tiny_repo):
    with ServerThread(model_repo=tiny_repo, simulated_device_ms=DEVICE_MS) as server:
        yield server


def test_every_task_answers_in_the_models_shapes_without_running_the_encoder(simulated):
    with Client(simulated.address, timeout=60) as client:
        info = {m.name: m for m in client.info().models}
        assert {m.provider for m in info.values()} == {SIMULATED}  # nobody mistakes its figures
        embedded = client.embed(TEXTS, model="tiny-embed", normalize=True)
        vectors = embedded.vectors
        assert vectors.shape == (3, info["tiny-embed"].dimension) and np.isfinite(vectors).all()
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        # every component equal: the constant answer, not a real model's embedding
        assert np.allclose(vectors, vectors[0, 0])
        filled = client.fill_mask(["the [MASK] sat on the [MASK]", "[MASK] a"], model="tiny-mlm", top_k=3)
        assert [len(r.masks) for r in filled.results] == [2, 1]
        for result in filled.results:
            for mask in result.masks:
                assert len(mask.candidates) == 3 and all(np.isfinite(c.score) for c in mask.candidates)
        classified = client.classify(TEXTS, model="tiny-classifier")
        labels = len(info["tiny-classifier"].labels)
        for result in classified.results:
            assert len(result.labels) == labels
            assert np.isclose(sum(s.score for s in result.labels), 1.0, atol=1e-5)
        maps = client.attention("the cat sat", model="tiny-embed", layers=[0], heads=[0, 1])
        matrix = maps.matrix(0, 1)
        assert matrix.shape == (maps.sequence_length, maps.sequence_length)
        assert np.allclose(matrix.sum(axis=1), 1.0, atol=1e-5)


def test_each_batch_takes_at_least_the_simulated_time(simulated):
    """The server's own histogram: every encoder batch's compute time includes the device's sleep."""
    with Client(simulated.address, timeout=60) as client:
        for _ in range(3):
            client.embed(TEXTS, model="tiny-embed")
            client.classify(TEXTS[:1], model="tiny-classifier")
    samples = scrape(simulated.metrics_url)
    name = "bertserve_inference_duration_seconds"
    batches = metric(samples, f"{name}_count", graph="encoder")
    assert batches >= 6
    assert metric(samples, f"{name}_sum", graph="encoder") >= batches * DEVICE_MS / 1e3
    # the encoder's run alone: every batch's (the warm-up's runs not counted), the device's time within
    runs = "bertserve_encoder_run_duration_seconds"
    assert metric(samples, f"{runs}_count") == batches
    run_s = metric(samples, f"{runs}_sum")
    assert batches * DEVICE_MS / 1e3 <= run_s <= metric(samples, f"{name}_sum", graph="encoder")
    assert metric(samples, "bertserve_model_info", provider=SIMULATED) == 3
