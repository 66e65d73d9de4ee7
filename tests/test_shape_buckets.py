"""Batch shapes (service/engine/shapes.py): the buckets a GPU's batches are padded up to, and a server that
pads to them answers as one that does not."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from bertserve.client import Client
from bertserve.service.engine.runtime import GraphSession
from bertserve.service.engine.shapes import buckets, ladder
from tests.helpers.server import ServerThread, metric, scrape
from tests.helpers.texts import random_texts


@pytest.mark.parametrize("top,first", [(64, 1), (256, 8), (4096, 1), (5, 8), (1, 1), (100, 8)])
def test_a_ladder_pads_by_at_most_half_and_ends_at_its_top(top, first):
    steps = ladder(top, first)
    assert steps[-1] == top and list(steps) == sorted(set(steps))
    assert len(steps) <= 2 * top.bit_length() + 1
    for value in range(min(first, top), top + 1):
        padded = next(s for s in steps if s >= value)
        assert padded <= max(first, 1.5 * value), (value, padded)


@pytest.mark.parametrize("limits", [(64, 16384, 256), (32, 2048, 128), (8, 100, 64), (3, 30, 12)])
def test_a_bucket_holds_its_batch_and_stays_within_the_tokens(limits):
    max_rows, max_tokens, max_length = limits
    shapes = buckets(max_rows, max_tokens, max_length)
    assert all(r * n <= max_tokens for r, n in shapes.all())
    for rows in range(1, max_rows + 1):
        for length in range(1, max_length + 1):
            if rows * length > max_tokens:
                continue
            padded_rows, padded_length = shapes.shape(rows, length)
            assert padded_rows >= rows and padded_length >= length
            assert padded_rows * padded_length <= max_tokens
            assert padded_rows <= max_rows and padded_length <= max_length


@pytest.fixture(scope="module")
def servers(tiny_repo):
    # one batch for one call (the default padding limit would cut it by length)
    settings = dict(model_repo=tiny_repo, models=["tiny-embed"], workers=1, max_padding_ratio=1000)
    with (
        ServerThread(**settings, batch_shapes="exact") as exact,
        ServerThread(**settings, batch_shapes="buckets") as bucketed,
    ):
        yield exact, bucketed


def test_a_bucketed_server_pads_each_batch_to_a_bucket_and_answers_the_same(servers):
    exact, bucketed = servers
    group = bucketed.server.core.encoders[0]
    shapes = []
    session = group.sessions[0]
    run = session.run

    def recording(feeds, outputs, captured=False):
        shapes.append(feeds["input_ids"].shape)
        return run(feeds, outputs, captured)

    texts = random_texts(5, seed=7, min_words=2, max_words=30)
    session.run = recording
    before = scrape(bucketed.metrics_url)
    try:
        with Client(bucketed.address, timeout=60) as client:
            padded = client.embed(texts, model="tiny-embed", dense=True, tokens=True)
    finally:
        session.run = run
    counted = metric(scrape(bucketed.metrics_url), "bertserve_batch_tokens_sum", model="tiny-embed")
    with Client(exact.address, timeout=60) as client:
        plain = client.embed(texts, model="tiny-embed", dense=True, tokens=True)
    longest = max(plain.metadata.input_tokens)
    assert shapes and all(shape in group.buckets.all() for shape in shapes)
    assert shapes[0] == group.buckets.shape(len(texts), longest) != (len(texts), longest)
    # the batch's padded tokens as computed (the metric and the deadline estimate's cost per token)
    before_sum = metric(before, "bertserve_batch_tokens_sum", model="tiny-embed")
    assert counted - before_sum == shapes[0][0] * shapes[0][1]
    assert np.abs(padded.vectors - plain.vectors).max() <= 1e-5
    for ours, theirs in zip(padded.tokens, plain.tokens, strict=True):
        assert ours.shape == theirs.shape and np.abs(ours - theirs).max() <= 1e-4


def test_buckets_are_warmed_up_before_serving_and_only_where_asked(tiny_repo, caplog, monkeypatch):
    ran: list[tuple[GraphSession, tuple[int, int]]] = []
    run = GraphSession.run

    def recording(self, feeds, outputs, captured=False):
        ran.append((self, feeds["input_ids"].shape))
        return run(self, feeds, outputs, captured)

    def encoder_runs(server: ServerThread) -> list[tuple[int, int]]:  # not the attention graph's
        sessions = server.server.core.encoders[0].sessions
        return [shape for session, shape in ran if session in sessions]

    monkeypatch.setattr(GraphSession, "run", recording)
    exact = ServerThread(model_repo=tiny_repo, models=["tiny-embed"], workers=1)  # auto: exact on CPU
    with caplog.at_level(logging.INFO, logger="bertserve.engine"), exact:
        assert exact.server.core.encoders[0].buckets is None
        assert len(encoder_runs(exact)) == 1  # the one warm-up batch
    assert "batch shapes warmed up" not in caplog.text
    ran.clear()
    bucketed = ServerThread(model_repo=tiny_repo, models=["tiny-embed"], workers=1, batch_shapes="buckets")
    with caplog.at_level(logging.INFO, logger="bertserve.engine"), bucketed:
        shapes, runs = bucketed.server.core.encoders[0].buckets.all(), encoder_runs(bucketed)
    assert set(shapes) <= set(runs) and len(runs) == len(shapes) + 1
    assert f"{len(shapes)} batch shapes warmed up on 1 instance(s)" in caplog.text


def test_at_the_gpu_overlays_limits_every_batch_meets_a_warmed_shape_padded_at_most_2_25x():
    shapes = buckets(64, 16384, 256)  # deploy/kubernetes/overlays/gpu
    warmed = set(shapes.all())
    # what the encoder asks of a batch's shape: a bucket (captured as a CUDA graph) or its own
    assert all(shapes.holds(shape) for shape in warmed) and not shapes.holds((5, 77))
    for rows in range(1, 65):
        for length in range(8, 257):
            if rows * length <= 16384:
                padded_rows, padded_length = shapes.shape(rows, length)
                assert (padded_rows, padded_length) in warmed
                assert padded_rows * padded_length <= 2.25 * rows * length


@pytest.mark.parametrize(
    "size,tokens,longest", [(64, 16384, 256), (32, 2048, 512), (4096, 65536, 8192), (5, 7, 3)]
)
def test_a_batch_gets_the_bucket_of_fewest_padded_tokens_that_holds_it(size, tokens, longest):
    ladders = buckets(size, tokens, longest)
    every = ladders.all()
    for rows in sorted({*range(1, min(size, 70) + 2), size, size + 1}):
        for length in sorted({*range(1, min(longest, 300) + 2, 7), longest, longest + 1}):
            held = [b for b in every if b[0] >= rows and b[1] >= length]
            want = min(held, key=lambda b: (b[0] * b[1], b)) if held else (rows, length)
            assert ladders.shape(rows, length) == want, (rows, length)
