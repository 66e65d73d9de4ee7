"""Captured runs (setting `cuda_graphs`, service/engine/captured_runs.py): an encoder's bucketed batches on
fixed buffers, each replayed as a CUDA graph on a GPU. Here, without one, the same fixed buffers run on the
CPU: their answers, their reuse, the warm-up that captures every bucket, and the fallbacks."""

from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort
import pytest

from bertserve.client import Client
from bertserve.service.engine import runtime
from bertserve.service.engine.captured_runs import CapturedRuns, run_options
from bertserve.service.engine.model_registry import load
from bertserve.service.engine.runtime import GraphSession
from bertserve.service.errors import StartupError
from bertserve.service.settings import Settings
from tests.helpers.server import ServerThread
from tests.helpers.texts import random_texts

DENSE, BOTH = ["sentence_embedding"], ["sentence_embedding", "last_hidden_state"]


def _encoder(repo) -> str:
    return str(repo / "tiny-embed" / "1" / "encoder.onnx")


def _feeds(session: GraphSession, rows: int, length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 90, size=(rows, length)).astype(np.int64)
    mask = np.ones((rows, length), np.int64)
    mask[0, length // 2 :] = 0
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {name: feeds[name] for name in session.input_names}


def test_captured_runs_answer_as_plain_runs_each_on_its_own_buffers(tiny_repo):
    session = GraphSession(_encoder(tiny_repo), "cpu", 1, 1)
    captured = CapturedRuns(session.session, "cpu", graphs=False)
    plan = [
        ((2, 8), DENSE),
        ((4, 12), BOTH),
        ((2, 8), DENSE),
        ((1, 16), DENSE),
        ((4, 12), BOTH),
        ((2, 8), BOTH),
    ]
    kept = None
    for seed, ((rows, length), outputs) in enumerate(plan):
        feeds = _feeds(session, rows, length, seed)
        ours, plain = captured.run(feeds, outputs), session.run(feeds, outputs)
        assert set(ours) == set(outputs)
        for name in outputs:
            assert ours[name].shape == plain[name].shape and np.allclose(ours[name], plain[name], atol=1e-6)
        if kept is None:  # the first run's answers and feeds, which later runs of its set must not touch
            kept = (ours["sentence_embedding"], plain["sentence_embedding"], feeds, _feeds(session, 2, 8, 0))
    # one set of buffers per (shape, outputs), reused; an answer is not overwritten by a later run
    assert len(captured) == 4
    assert np.allclose(kept[0], kept[1], atol=1e-6)
    assert all(np.array_equal(kept[2][name], kept[3][name]) for name in kept[2])
    feeds = _feeds(session, 4, 12, 9)
    assert set(captured.run(feeds, BOTH[::-1])) == set(BOTH) and len(captured) == 4  # any order, one set
    captured.frozen = True  # after the warm-up: a new set is not made, the caller runs plain
    assert captured.run(_feeds(session, 3, 8, 0), DENSE) is None and len(captured) == 4
    assert captured.run(feeds, BOTH) is not None


def test_each_captured_set_is_its_own_cuda_graph_and_other_runs_are_never_captured(tiny_repo, monkeypatch):
    session = GraphSession(_encoder(tiny_repo), "cpu", 1, 1)
    captured = CapturedRuns(session.session, "cpu", graphs=True)  # the CPU provider ignores the graph ids
    for rows, length in [(2, 8), (4, 8), (2, 8)]:
        captured.run(_feeds(session, rows, length, 0), DENSE)
    ids = [run.options.get_run_config_entry("gpu_graph_id") for run in captured._runs.values()]
    assert ids == ["1", "2"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: [runtime.CUDA, runtime.CPU])
    (name, options), cpu = runtime.providers_for("auto", cuda_graphs=True)
    assert name == runtime.CUDA and options["enable_cuda_graph"] == "1" and cpu == runtime.CPU
    assert "enable_cuda_graph" not in runtime.providers_for("auto")[0][1]
    # a session with graphs runs the rest as graph -1 (without an id, ONNX Runtime would capture the run as
    # graph 0 and replay it ever after); a session without runs them with no id at all
    assert run_options(runtime.NOT_CAPTURED).get_run_config_entry("gpu_graph_id") == "-1"
    with pytest.raises(RuntimeError):
        run_options(None).get_run_config_entry("gpu_graph_id")


def test_cuda_graphs_on_refuses_to_start_where_a_session_cannot_have_them(tiny_repo, monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: [runtime.CPU])  # this test's machine: no GPU
    assert GraphSession(_encoder(tiny_repo), "auto", 1, 1, cuda_graphs="auto").captured is None
    with pytest.raises(StartupError, match="cuda_graphs on needs a CUDA session"):
        GraphSession(_encoder(tiny_repo), "auto", 1, 1, cuda_graphs="on")
    for refused in (dict(batch_shapes="exact"), dict(instances=2)):
        with pytest.raises(StartupError, match="cuda_graphs on needs batch shapes .* and instances 1"):
            load(Settings(model_repo=tiny_repo, models=["tiny-embed"], cuda_graphs="on", **refused))


def test_a_session_that_cannot_be_made_with_graphs_is_made_without_them_under_auto(
    tiny_repo, monkeypatch, caplog
):
    """ONNX Runtime refuses CUDA graphs where a node of the graph runs outside CUDA: auto goes on without."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: [runtime.CUDA, runtime.CPU])
    opened = []
    real_open = GraphSession._open

    def refusing(path, options, providers):
        graphs = any(isinstance(p, tuple) and "enable_cuda_graph" in p[1] for p in providers)
        opened.append(graphs)
        if graphs:
            raise StartupError(f"{path}: ONNX Runtime cannot load it: not every node on CUDA")
        return real_open(path, options, [runtime.CPU])

    monkeypatch.setattr(GraphSession, "_open", staticmethod(refusing))
    with caplog.at_level(logging.WARNING, logger=runtime.__name__):
        session = GraphSession(_encoder(tiny_repo), "auto", 1, 1, cuda_graphs="auto")
    assert opened == [True, False] and session.captured is None
    assert "no CUDA graphs, plain runs instead" in caplog.text
    with pytest.raises(StartupError, match="not every node on CUDA"):
        GraphSession(_encoder(tiny_repo), "auto", 1, 1, cuda_graphs="on")


def test_a_captured_run_that_fails_stops_capturing_and_the_batch_runs_plain(tiny_repo, caplog):
    session = GraphSession(_encoder(tiny_repo), "cpu", 1, 1)
    feeds = _feeds(session, 2, 8, 0)
    want = session.run(feeds, DENSE)

    class Broken(CapturedRuns):
        def run(self, feeds, outputs):
            raise RuntimeError("CUDA failure 700: an illegal memory access")

    session.captured = Broken(session.session, "cpu", graphs=False)
    with caplog.at_level(logging.WARNING, logger=runtime.__name__):
        got = session.run(feeds, DENSE, captured=True)
    assert np.allclose(got["sentence_embedding"], want["sentence_embedding"], atol=1e-6)
    assert session.captured is None and "no more captured runs: a captured run failed" in caplog.text


def _capture_on_cpu(monkeypatch) -> None:
    """Encoder sessions (cuda_graphs not off) capture on the CPU as they would on a GPU."""
    init = GraphSession.__init__

    def capturing(self, *args, cuda_graphs="off", **kwargs):
        init(self, *args, cuda_graphs=cuda_graphs, **kwargs)
        if cuda_graphs != "off":
            self.captured = CapturedRuns(self.session, self.device, graphs=False)

    monkeypatch.setattr(GraphSession, "__init__", capturing)


@pytest.fixture
def capturing_on_cpu(monkeypatch):
    _capture_on_cpu(monkeypatch)


def _count_replays(captured: CapturedRuns) -> list[int]:
    """A counter of `captured`'s runs of sets it already had (the session's run_with_iobinding, counted)."""
    count, session = [0], captured._session

    class Counting:
        def __getattr__(self, name):
            return getattr(session, name)

        def run_with_iobinding(self, binding, options):
            count[0] += 1
            return session.run_with_iobinding(binding, options)

    captured._session = Counting()
    return count


def test_the_warm_up_captures_every_bucket_and_a_served_call_replays_them(tiny_repo, capturing_on_cpu):
    settings = dict(model_repo=tiny_repo, models=["tiny-embed"], workers=1, max_padding_ratio=1000)
    texts = random_texts(6, seed=3, min_words=2, max_words=30)
    with ServerThread(**settings, batch_shapes="exact") as exact, Client(exact.address, timeout=60) as client:
        want = client.embed(texts, model="tiny-embed", dense=True, tokens=True)
    with ServerThread(**settings, batch_shapes="buckets") as bucketed:
        group = bucketed.server.core.encoders[0]
        captured = group.sessions[0].captured
        buckets = set(group.buckets.all())
        dense = {dict(inputs)["input_ids"] for inputs, outputs in captured._runs if outputs == tuple(DENSE)}
        assert dense == buckets and captured.frozen  # every bucket of the default outputs, before serving
        assert group.batcher.cost_fit.fit is not None  # the replays gave the batcher a first batch cost
        before, replays = len(captured), _count_replays(captured)
        with Client(bucketed.address, timeout=60) as client:
            for _ in range(2):
                got = client.embed(texts, model="tiny-embed", dense=True, tokens=True)  # another set: plain
                assert np.abs(got.vectors - want.vectors).max() <= 1e-5
                for ours, theirs in zip(got.tokens, want.tokens, strict=True):
                    assert ours.shape == theirs.shape and np.abs(ours - theirs).max() <= 1e-4
                dense_only = client.embed(texts, model="tiny-embed")
                assert np.abs(dense_only.vectors - want.vectors).max() <= 1e-5
        assert len(captured) == before and replays[0] >= 2  # nothing captured while serving; replays ran


def test_cuda_graphs_on_fails_the_start_where_the_warm_up_captured_nothing(tiny_repo, monkeypatch):
    init = GraphSession.__init__

    def failing(self, *args, cuda_graphs="off", **kwargs):
        init(self, *args, cuda_graphs="off", **kwargs)
        if cuda_graphs != "off":  # as a GPU session whose captures fail: it stops capturing
            self.captured = CapturedRuns(self.session, self.device, graphs=False)
            self.captured.run = lambda feeds, outputs: 1 / 0
            self.graphs_required = cuda_graphs == "on"

    monkeypatch.setattr(GraphSession, "__init__", failing)
    settings = dict(model_repo=tiny_repo, models=["tiny-embed"], workers=1, batch_shapes="buckets")
    with ServerThread(**settings, cuda_graphs="auto") as server, Client(server.address, timeout=60) as client:
        assert server.server.core.encoders[0].sessions[0].captured is None  # plain runs: it serves
        assert client.embed(["the cat sat"], model="tiny-embed").vectors.shape[0] == 1
    with pytest.raises(StartupError, match="cuda_graphs on, but no batch shape was captured"):
        ServerThread(**settings, cuda_graphs="on").start()


def test_an_encoder_of_several_instances_never_captures(tiny_repo, capturing_on_cpu):
    """ONNX Runtime keeps a session's captured graphs per thread: only one instance's one worker may."""
    for sessions in ("shared", "separate"):
        settings = Settings(
            model_repo=tiny_repo, models=["tiny-embed"], instances=2, instance_sessions=sessions
        )
        assert all(s.captured is None for s in load(settings).encoders[0].sessions)
    one = Settings(model_repo=tiny_repo, models=["tiny-embed"])
    assert load(one).encoders[0].sessions[0].captured is not None
