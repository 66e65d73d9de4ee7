"""The bench's EmbedStream phases (bench/streaming.py) against a real server: every input answered once,
unary latency measured alone and during a stream, and the ratios derived from them."""

from __future__ import annotations

import asyncio
import math

from bertserve.bench import analysis, streaming
from bertserve.bench.loadgen import make_requests
from tests.test_streaming import MODEL, corpus


def test_stream_phases_answer_every_input_and_measure_unary_latency(tiny_server):
    texts = corpus(300, seed=9)
    requests = make_requests(texts[:40], [1] * 40, 1, lambda tokens: 0.0)
    result = asyncio.run(streaming.phases(tiny_server.address, MODEL, texts, requests, 20.0, lambda _: None))

    alone = result["alone"]
    streamed = 300 * math.ceil(streaming.STREAM_MIN_INPUTS / 300)  # the corpus repeated to at least that
    assert alone["inputs"] == streamed and alone["errors"] == 0
    assert alone["requests"] == math.ceil(streamed / streaming.STREAM_BATCH)
    for phase in ("unary_alone", "unary_during_stream"):
        windows = streaming.UNARY_WINDOWS  # alone and during a stream alternate, each side over every window
        assert result[phase]["requests_ok"] == windows * 40 and result[phase]["errors"] == {}, phase
        assert result[phase]["p99_ms"] >= result[phase]["p50_ms"] > 0, phase
    beside = result["stream_beside_unary"]
    assert beside["errors"] == 0 and beside["inputs"] > 0  # the stream ran the whole time, then stopped

    ratios = analysis._stream_ratios(result, 2 * alone["inputs_per_s"])
    assert math.isclose(ratios["stream_vs_inprocess"], 0.5)
    assert ratios["unary_p99_during_stream_vs_alone"] > 0
    assert analysis._stream_ratios(None, 1.0) == {
        "stream_vs_inprocess": None,
        "stream_vs_inprocess_first_ceiling": None,
        "unary_p99_during_stream_vs_alone": None,
    }
