"""`bertserve bench`: its parts (corpus, FLOPs, load generator) and one tiny end-to-end run.

The end-to-end run drives all four targets (bertserve fp32, batching off, int8, and the naive
transformers server) on the tiny random model with a handful of requests: it checks the machinery
and its bookkeeping, not performance.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from bertserve.bench import handler_floor, limits, simulated_device, transport_floor
from bertserve.bench.corpus import MIXED_CORPUS, fixed_length_corpus, load_tokenizer, mixed_corpus
from bertserve.bench.flops import encoder_flops
from bertserve.bench.loadgen import Request, closed_loop, make_requests, open_loop
from bertserve.cli import main
from bertserve.export.default_model import default_checkpoint_dir
from bertserve.manifest import ModelDimensions

TARGETS = ("server-fp32", "server-fp32-bs1", "server-int8", "naive-fp32")


@pytest.fixture(scope="module")
def minilm_tokenizer():
    return load_tokenizer(default_checkpoint_dir() / "tokenizer.json", max_length=512)


def test_shipped_corpus_spans_5_to_200_tokens_mostly_short(minilm_tokenizer):
    corpus = mixed_corpus(minilm_tokenizer)
    assert len(corpus.texts) == len(MIXED_CORPUS.read_text().splitlines()) >= 1000
    assert min(corpus.tokens) >= 5 and max(corpus.tokens) <= 200
    ordered = sorted(corpus.tokens)
    median = ordered[len(ordered) // 2]
    assert median < corpus.mean_tokens < 2 * median  # skewed: a long tail above a short median
    assert sum(t > 150 for t in corpus.tokens) >= 20  # and the tail is really there
    assert mixed_corpus(minilm_tokenizer, limit=50).texts == mixed_corpus(minilm_tokenizer, limit=50).texts


def test_fixed_length_texts_have_exactly_that_many_tokens(minilm_tokenizer):
    corpus = fixed_length_corpus(minilm_tokenizer, 128, 20)
    assert [len(e.ids) for e in minilm_tokenizer.encode_batch(corpus.texts)] == [128] * 20
    assert len(set(corpus.texts)) == 20


@pytest.mark.parametrize("tokens", [1, 37, 128])
def test_flops_formula_matches_torch_flop_counter(tokens):
    config = transformers.BertConfig(
        vocab_size=777, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=80,
        max_position_embeddings=128, attn_implementation="eager",
    )  # fmt: skip
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    ids = torch.randint(5, 777, (1, tokens))
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    dimensions = ModelDimensions(**{k: getattr(config, k) for k in ModelDimensions.model_fields})
    assert encoder_flops(dimensions, tokens) == counter.get_total_flops()


@pytest.mark.parametrize(
    ("flags", "vendor", "family", "fp32_per_cycle", "int8_per_cycle"),
    [
        ({"avx2", "fma"}, "AuthenticAMD", 25, 32, 128),  # Zen 3: two 256-bit FMA pipes
        ({"avx2", "avx512f", "avx512_vnni"}, "AuthenticAMD", 25, 32, 256),  # Zen 4: AVX-512 on 256-bit halves
        ({"avx2", "avx512f", "avx512_vnni"}, "GenuineIntel", 6, 64, 256),  # two 512-bit FMA units
        ({"avx2", "avx512f", "avx512_vnni", "amx_int8"}, "GenuineIntel", 6, 64, 2048),  # AMX tiles
    ],
)
def test_theoretical_peak_follows_the_widest_unit(flags, vendor, family, fp32_per_cycle, int8_per_cycle):
    peak = limits.peaks(flags, vendor, family, ghz=2.0, cores=4)
    assert (peak["fp32_ops_per_cycle_per_core"], peak["int8_ops_per_cycle_per_core"]) == (
        fp32_per_cycle,
        int8_per_cycle,
    )
    assert peak["fp32_gflops"] == 4 * 2.0 * fp32_per_cycle and peak["int8_gops"] == 4 * 2.0 * int8_per_cycle


def test_a_reported_clock_below_the_measured_kernels_is_raised_until_they_fit():
    """A VM reports its base clock; the cores boost above it: the peaks must stay a limit nothing exceeds."""
    theory = limits.peaks({"avx2", "avx512f", "avx512_vnni"}, "GenuineIntel", 6, ghz=2.3, cores=2)
    theory["clock_source"] = "/proc/cpuinfo"
    assert limits.fitted_to_kernels(theory, {"fp32_gflops": 280.0, "int8_gops": 900.0}) == theory
    fitted = limits.fitted_to_kernels(theory, {"fp32_gflops": 325.79, "int8_gops": 1030.67})
    assert fitted["clock_ghz"] == 2.546 and fitted["reported_clock_ghz"] == 2.3  # 325.79 / (2 x 64)
    assert 325.79 <= fitted["fp32_gflops"] <= 326.0 and fitted["int8_gops"] == 4 * fitted["fp32_gflops"]
    assert "raised from 2.3 GHz" in fitted["clock_source"]


def test_closed_loop_sends_each_request_once_and_counts_failures():
    seen: list[str] = []

    async def call(texts):
        await asyncio.sleep(0.001)
        seen.extend(texts)
        if "t7" in texts:
            raise grpc.aio.AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, None, None, "full")
        return None

    requests = make_requests([f"t{i}" for i in range(20)], [3] * 20, 2, flops_of=lambda t: 10.0 * t)
    result = asyncio.run(closed_loop(call, requests, concurrency=4))
    assert sorted(seen) == sorted(f"t{i}" for i in range(20))
    assert result.errors == {"RESOURCE_EXHAUSTED": 1}
    assert (result.inputs, result.tokens, result.flops, len(result.latencies)) == (18, 54, 540.0, 9)


def test_open_loop_keeps_its_schedule_when_the_server_is_slow():
    async def slow(texts):
        await asyncio.sleep(0.2)

    requests = [Request(["x"], 1, 1.0)] * 20
    result = asyncio.run(open_loop(slow, requests, rate=200.0))
    # closed loop at concurrency 1 would need 20 x 0.2 s; arrivals every ~5 ms overlap the slow calls
    # (about 0.3 s; the rest is slack for a loaded machine)
    assert result.seconds < 3.0 and len(result.latencies) == 20
    assert min(result.latencies) >= 0.2


TEXTS = 48  # the tiny bench's mixed texts: its single-input phase's loop CPU must span clock ticks (10 ms)


def test_quick_bench_runs_every_target_on_a_tiny_model(tiny_repo, make_tiny_checkpoint, tmp_path):
    out = tmp_path / "bench"
    argv = ["bench", "--model-repo", str(tiny_repo), "--model", "tiny-embed", "--checkpoint",
            str(make_tiny_checkpoint("BertModel")), "--out", str(out), "--quick", "--threads", "1",
            "--concurrency", "1,4", "--texts", str(TEXTS), "--fixed-texts", "8"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "bench.json").read_text())  # strict JSON: no NaN
    assert not Path(result["model"]["checkpoint"]).is_absolute()  # committed results name no machine's paths
    # the gRPC targets' phases came from the native client, whose own CPU is the load generator's
    assert result["settings"]["load_generator"]["kind"] == "native"
    for phase in result["targets"]["server-fp32"]["closed"]:
        assert phase["client_cpu_cores"] > 0

    ratio_keys = (
        "server_vs_inprocess",
        "server_vs_naive_fp32",
        "int8_vs_naive",
        "gemm_peak_fraction",
        "single_vs_bulk",
    )
    for key in ratio_keys:
        assert math.isfinite(result["ratios"][key]) and result["ratios"][key] > 0, key
    per_call = result["targets"]["server-fp32"]["per_call"]  # the same texts, one per call and 32 per call
    assert per_call["single"]["inputs"] == per_call["bulk"]["inputs"] == TEXTS
    assert (
        per_call["bulk"]["requests_ok"] == math.ceil(TEXTS / 32)
        and per_call["single"]["requests_ok"] == TEXTS
    )
    profile = result["per_call_profile"]  # where a call's cost goes: CPU per input, the loop's share of it
    assert (
        profile["single"]["loop_cpu_ms_per_input"] > 0
    )  # TEXTS calls: several 10 ms clock ticks of loop CPU
    for kind in ("single", "bulk"):
        row, phase = profile[kind], per_call[kind]
        assert row["inputs_per_s"] == phase["inputs_per_s"]
        # each figure is counted in clock ticks, and the kernel rounds a thread's and its process's apart:
        # in a phase of a tick or two (the bulk phase's 2 calls) the loop may read one tick above the whole
        tick_ms_per_input = 1e3 / os.sysconf("SC_CLK_TCK") / phase["inputs"]
        assert 0 <= row["loop_cpu_ms_per_input"] <= row["server_cpu_ms_per_input"] + tick_ms_per_input, kind
        padded_us = 1e6 * phase["server"]["inference_busy_fraction"] * phase["seconds"]
        assert math.isclose(
            row["inference_us_per_padded_token"],
            padded_us / phase["server"]["batch_tokens_padded"],
            rel_tol=1e-6,
        )
    assert (
        result["padding_ratio"] >= 1.0
        and result["gemm_peak_fraction"] == result["ratios"]["gemm_peak_fraction"]
    )
    assert result["gemm"]["peak_gflops"] > 0
    limits = result["ratios"]["limits"]
    theory = limits["theoretical"]
    assert math.isclose(  # the peak is written to one decimal (rounded up where the clock was fitted)
        theory["fp32_gflops"],
        theory["cores"] * theory["clock_ghz"] * theory["fp32_ops_per_cycle_per_core"],
        rel_tol=1e-3,
        abs_tol=0.1,
    )
    assert limits["kernel"]["fp32_gflops"] > 0 and limits["kernel"]["int8_gops"] > 0
    assert {"server-fp32", "server-int8", "inprocess-fp32-mixed"} <= set(limits["fractions"])
    for name, fraction in limits["fractions"].items():
        # the theoretical peak is a bound nothing exceeds; the kernel's is measured, and on a machine whose
        # load changes between that measurement and a target's it can read above 1
        assert 0 < fraction["of_theoretical"] <= 1.0 and fraction["of_kernel"] > 0, name
    assert set(result["targets"]) == set(TARGETS)
    for name, target in result["targets"].items():
        assert target["exit_code"] == 0, name  # every server drained and exited cleanly on SIGTERM
        for phase in [*target["closed"], target["fixed"], target["open"]]:
            assert phase["errors"] == {} and phase["requests_ok"] == phase["inputs"], (name, phase["mode"])
            assert phase["reply_tokens"] == phase["tokens"], name  # the server counts the tokens we count
            if name != "naive-fp32":
                assert phase["server"]["inputs"] == phase["inputs"], name  # /metrics saw exactly this phase
                assert phase["server"]["batch_tokens_padded"] >= phase["tokens"], name
    for phase in result["targets"]["server-fp32-bs1"]["closed"]:
        assert phase["server"]["batch_size_mean"] == 1.0
        assert phase["server"]["batch_tokens_padded"] == phase["tokens"]  # batch of one: no padding
    assert [p["concurrency"] for p in result["targets"]["server-fp32"]["closed"]] == [1, 4]
    # the sweep and the lone stream are held against the ceiling measured right before and after each
    server = result["targets"]["server-fp32"]
    for phase, key in (
        (server["saturation"], "server_vs_inprocess"),
        (server["stream"]["alone"], "stream_vs_inprocess"),
    ):
        assert len(phase["ceiling_checks"]) == 2 and min(phase["ceiling_checks"]) > 0, key
        assert math.isclose(
            result["ratios"][key], phase["inputs_per_s"] / (sum(phase["ceiling_checks"]) / 2), rel_tol=1e-9
        )
    windows = server["stream"]["unary_windows"]  # the lone caller's windows, alone and during, alternated
    assert server["stream"]["unary_alone"]["requests_ok"] == windows * TEXTS
    for precision in ("fp32", "int8"):
        profile = result["profile"][precision]
        assert math.isclose(sum(profile["share_by_op"].values()), 1.0, rel_tol=1e-6)
        assert (out / profile["trace"]).is_file()
    assert "MatMul" in result["profile"]["fp32"]["share_by_op"]

    # the transport's floor: a no-work call alone and paced, and the goals' estimates beside it
    floor, phases = result["transport_floor"], server["transport_floor"]
    for kind in ("alone", "paced"):
        phase = phases[kind]
        assert phase["errors"] == {} and phase["requests_ok"] == phase["inputs"] > 0, kind
    assert floor["p50_ms_alone"] == phases["alone"]["p50_ms"] > 0
    assert floor["cpu_ms_per_call"] > 0 and floor["server_cpu_ms_per_call"] > 0
    estimated = {
        g["metric"]: g["estimate_at_transport_floor"]
        for g in result["goals"]
        if "estimate_at_transport_floor" in g
    }
    assert estimated.keys() == floor["estimates"].keys() == {"server_vs_inprocess", "single_vs_bulk", "int8_vs_server_fp32", "p50_c1_minus_inprocess_ms"}  # fmt: skip
    assert 0 < estimated["server_vs_inprocess"] <= 1 and 0 < estimated["single_vs_bulk"] <= 1
    # the handler's floor: server-fp32's c=1 calls against a bare grpc.aio handler, inline and in a thread
    # each c=1 phase is held against the in-process p50 measured right before and after it
    handler, c1 = result["handler_floor"], server["closed"][0]
    for phase in (c1, handler["inline"], handler["thread"]):
        assert len(phase["single_p50_checks"]) == 2 and min(phase["single_p50_checks"]) > 0
    assert math.isclose(
        result["ratios"]["p50_c1_minus_inprocess_ms"], c1["p50_ms"] - sum(c1["single_p50_checks"]) / 2
    )
    for mode in ("inline", "thread"):
        floor_phase = handler[mode]
        assert floor_phase["errors"] == {} and floor_phase["requests_ok"] == c1["requests_ok"], mode
        assert floor_phase["p50_ms"] > 0 and floor_phase["reply_inference_ms_mean"] > 0, mode
        adjacent = sum(floor_phase["single_p50_checks"]) / 2
        assert math.isclose(floor_phase["p50_minus_inprocess_ms"], floor_phase["p50_ms"] - adjacent)
    assert estimated["p50_c1_minus_inprocess_ms"] == handler["thread"]["p50_minus_inprocess_ms"]
    inprocess = result["inprocess"]
    assert math.isclose(
        result["ratios"]["int8_vs_fp32_inprocess"],
        inprocess["int8"]["mixed"]["inputs_per_s"] / inprocess["fp32"]["mixed"]["inputs_per_s"],
    )

    # the simulated device (bench/simulated_device.py): single-input callers per workers value
    simulated = result["simulated_device"]
    assert (
        list(simulated["workers"]) == ["1", "2", "auto", "native", "native-2", "http"]
        and simulated["concurrency"] == 32
    )
    for workers, row in simulated["workers"].items():
        if "skipped" in row:  # a server without the workers setting: noted, never measured as if it had it
            assert workers != "1" and f"simulated-device: {row['skipped']}" in result["notes"]
            continue
        rounds = row["rounds"]  # interleaved with the other servers' rounds
        assert len(rounds) == simulated_device.ROUNDS and row["exit_code"] == 0 and row["errors"] == {}, (
            workers
        )
        for phase in rounds:
            assert phase["errors"] == {} and phase["inputs"] == phase["server"]["inputs"] > 0, workers
            assert phase["server"]["inference_ms_mean"] >= 1.0  # each batch took the device's 1 ms at least
        assert row["calls"] == sum(phase["inputs"] for phase in rounds), workers
        assert row["calls"] == 3000 or row["stopped_early"], workers  # the quick preset's calls
        fronts = {"2": 2, "native-2": 2}.get(workers, 1)
        assert row["cpu_ms_per_call"] > 0 and row["processes"] >= (fronts + 2 if fronts > 1 else 1)
        seconds = sum(phase["seconds"] for phase in rounds)
        assert math.isclose(row["inputs_per_s"], row["calls"] / seconds), workers  # pooled over the rounds
    widest = max(
        (r for w, r in simulated["workers"].items() if "skipped" not in r and w in ("1", "2", "auto")),
        key=lambda r: r["processes"],
    )
    native = simulated["workers"]["native"]  # one process, its load on the native port
    assert native["processes"] == 1 and simulated["native_cpu_ms_per_call"] == native["cpu_ms_per_call"]
    assert (
        simulated["native_vs_one_worker"]
        == native["inputs_per_s"] / simulated["workers"]["1"]["inputs_per_s"]
    )
    assert result["front_cpu_ms_per_call"] == simulated["front_cpu_ms_per_call"] == widest["cpu_ms_per_call"]
    goals = {g["metric"]: g["measured"] for g in result["goals"]}
    assert goals["front_cpu_ms_per_call"] == result["front_cpu_ms_per_call"]
    assert goals["simulated_two_vs_one_worker"] == simulated["two_vs_one_worker"]
    assert goals["native_cpu_ms_per_call"] == simulated["native_cpu_ms_per_call"]
    two = simulated["workers"]["native-2"]  # two fronts, the load on their native port
    assert two["processes"] >= 4 and goals["native_two_cpu_ms_per_call"] == two["cpu_ms_per_call"]
    assert (
        goals["native_two_vs_one_worker"]
        == simulated["native_two_vs_one_worker"]
        == (two["inputs_per_s"] / simulated["workers"]["1"]["inputs_per_s"])
    )
    http = simulated["workers"]["http"]  # one process, its load POSTed by the native HTTP load generator
    assert http["processes"] == 1 and simulated["http_cpu_ms_per_call"] == http["cpu_ms_per_call"]
    assert (
        goals["simulated_http_vs_native"]
        == simulated["http_vs_native"]
        == (http["inputs_per_s"] / native["inputs_per_s"])
    )

    table = (out / "bench.md").read_text()
    assert all(name in table for name in TARGETS) and "| metric | goal | measured | met |" in table
    assert "## Simulated device (1 ms per batch" in table
    assert "estimate at the transport's floor" in table and "a call that does no work" in table
    assert "The p50 one is the handler's floor below" in table
    assert "The handler's floor (bench/handler_floor.py)" in table
    assert "Load generator: the native clients" in table
    assert "| requests | inputs per s | server cpu ms per input | loop cpu ms per input |" in table
    for plot in ("throughput.png", "latency.png"):
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_transport_floor_estimates_give_the_encoder_the_cpu_a_no_work_call_leaves():
    inprocess = {"fp32": {"mixed": {"inputs_per_s": 200.0}}, "int8": {"mixed": {"inputs_per_s": 400.0}}}
    floor = {"cpu_ms_per_call": 1.0, "p50_ms_alone": 0.6}
    got = transport_floor.estimates(floor, inprocess, 180.0, 32, threads=2, logical_cores=2)
    # 200 calls/s x 1 ms = 0.2 cores taken from 2: 2 / 2.2 of the ceiling
    assert math.isclose(got["server_vs_inprocess"], 1 / 1.1)
    # a 32-input request pays 1/32 of a call per input already
    assert math.isclose(got["single_vs_bulk"], 1 / (1 + 180 * (31 / 32) / 1e3 / 2))
    # int8 at 400 calls/s loses 0.4 cores: (400 / 1.2) / (200 / 1.1)
    assert math.isclose(got["int8_vs_server_fp32"], (400 / 1.2) / (200 / 1.1))
    assert got["p50_c1_minus_inprocess_ms"] == 0.6
    # where the handler's floor was measured, it is the p50 goal's estimate
    handler = transport_floor.estimates(floor, inprocess, 180.0, 32, 2, 2, handler_p50_over_inprocess_ms=0.9)
    assert handler["p50_c1_minus_inprocess_ms"] == 0.9
    # cores the targets' threads leave idle take the transport's CPU first
    spare = transport_floor.estimates(floor, inprocess, 180.0, 32, threads=2, logical_cores=3)
    assert spare["server_vs_inprocess"] == spare["single_vs_bulk"] == 1.0
    assert math.isclose(spare["int8_vs_server_fp32"], 2.0)
    # nothing measured: nothing estimated
    blank = transport_floor.estimates({"p50_ms_alone": None}, {}, None, 32, threads=2, logical_cores=2)
    assert set(blank.values()) == {None}


def test_windows_of_a_phase_merge_into_one_result():
    from bertserve.bench.loadgen import PhaseResult

    a = PhaseResult(
        "closed", 1, None, 3, False, 1.5, [0.1, 0.2], inputs=2, tokens=20, errors=Counter(UNAVAILABLE=1)
    )
    b = PhaseResult("closed", 1, None, 4, True, 2.0, [0.3], inputs=1, tokens=7, errors=Counter(UNAVAILABLE=2))
    merged = PhaseResult.merged([a, b])
    assert (merged.requests_planned, merged.stopped_early, merged.seconds) == (7, True, 3.5)
    assert merged.latencies == [0.1, 0.2, 0.3] and (merged.inputs, merged.tokens) == (3, 27)
    assert merged.errors == Counter(UNAVAILABLE=3) and a.latencies == [0.1, 0.2]  # the parts are untouched


def test_a_phase_stops_sending_at_its_time_limit():
    async def slow(texts):
        await asyncio.sleep(0.05)

    requests = [Request(["x"], 1, 1.0)] * 200
    closed = asyncio.run(closed_loop(slow, requests, concurrency=2, time_limit_s=0.3))
    # unlimited, the phases would take 5 s and 2 s; the rest of the bound is slack for a loaded machine
    assert closed.stopped_early and 4 <= len(closed.latencies) < 40 and closed.seconds < 1.5
    opened = asyncio.run(open_loop(slow, requests, rate=100.0, time_limit_s=0.3))
    assert opened.stopped_early and 5 <= len(opened.latencies) < 100 and opened.seconds < 1.5
    assert closed.summary()["requests_planned"] == 200


def test_a_ceiling_keeps_its_fastest_pass_of_as_many_as_fill_its_time(monkeypatch):
    """A GPU's ceiling pass lasts milliseconds: two slow ones in a row (a lease's H200 read a fifth of its
    rate so) must not be the figure when more passes fit in the time asked for."""
    import time

    from bertserve.bench import inprocess

    slow = iter([0.02, 0.02])  # the first two passes disturbed, the rest fast

    def timed(sessions, batches):
        seconds = next(slow, 0.004)
        time.sleep(seconds)
        return seconds

    monkeypatch.setattr(inprocess, "_timed_pass", timed)
    assert inprocess._fastest_pass([], [], 2, 0.0) == 0.02  # two passes: both disturbed
    slow = iter([0.02, 0.02])
    assert inprocess._fastest_pass([], [], 2, 0.1) == 0.004


def test_the_ceiling_runs_every_batch_once_on_each_instance_at_once():
    """With model instances, the in-process ceiling runs its sessions side by side, as the server does."""
    import threading

    from bertserve.bench.inprocess import Batch, _timed_pass

    meet = threading.Barrier(2, timeout=5)  # broken unless both sessions compute at the same time
    ran: list[tuple[int, int]] = []

    class Session:
        def __init__(self, number):
            self.number = number

        def run(self, outputs, feeds):
            if not any(n == self.number for n, _ in ran):
                meet.wait()
            ran.append((self.number, int(feeds["input_ids"][0, 0])))

    batches = [Batch({"input_ids": np.full((1, 3), k)}, 1, 3, 3) for k in range(10)]
    assert _timed_pass([Session(0), Session(1)], batches) > 0
    assert sorted(k for _, k in ran) == list(range(10))
    assert {n for n, _ in ran} == {0, 1}


@pytest.mark.parametrize(
    "settings, provider, layout",
    [
        ({}, "cpu", None),
        ({"instances": "2"}, "cpu", (2, 2, True)),  # the bench gives every instance --threads threads
        ({"instances": "2", "intra_op_threads": "1"}, "cpu", (2, 1, True)),
        ({"instances": "2", "instance_sessions": "separate"}, "cpu", (2, 2, False)),
        ({"instances": "2"}, "cuda", (2, 2, False)),  # auto: a session per instance on CUDA
    ],
)
def test_the_ceiling_tries_the_servers_own_instance_layout(tmp_path, settings, provider, layout):
    from bertserve.bench.config import BenchConfig

    config = BenchConfig(tmp_path, tmp_path, threads=2, server_settings=settings, provider=provider)
    assert config.ceiling_layouts == [(1, 2, False)] + ([layout] if layout else [])


def test_a_handler_floor_that_cannot_start_costs_a_note_not_the_run(tiny_repo, tmp_path, monkeypatch):
    real = handler_floor.process

    def exits_at_once(*args):
        server = real(*args)
        server.argv = [sys.executable, "-c", "raise SystemExit(3)"]
        return server

    monkeypatch.setattr(handler_floor, "process", exits_at_once)
    out = tmp_path / "bench"
    argv = ["bench", "--model-repo", str(tiny_repo), "--model", "tiny-embed", "--out", str(out), "--quick",
            "--threads", "1", "--targets", "server-fp32", "--concurrency", "1", "--texts", "8",
            "--fixed-texts", "4"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "bench.json").read_text())
    assert result["handler_floor"] is None
    assert [n for n in result["notes"] if "handler's floor was not measured" in n and "exited with 3" in n]
    # what the targets measured is kept, the p50 goal's estimate falls back to the no-work call
    assert result["ratios"]["p50_c1_minus_inprocess_ms"] is not None
    floor = result["transport_floor"]
    assert floor["estimates"]["p50_c1_minus_inprocess_ms"] == floor["p50_ms_alone"]
    assert floor["p50_estimate_source"] == transport_floor.NO_WORK_ESTIMATE
    table = (out / "bench.md").read_text()
    assert "The p50 one is the no-work call's p50" in table and "The handler's floor" not in table


def test_a_handler_floor_phase_with_failed_calls_gives_no_figure():
    answered = {"p50_ms": 6.5, "errors": {}, "requests_ok": 40, "reply_inference_ms_mean": 5.0}
    phases = {
        "inline": answered | {"single_p50_checks": [5.0, 6.0]},  # held against the checks' mean
        "thread": answered | {"p50_ms": float("nan"), "errors": {"UNAVAILABLE": 40}, "requests_ok": 0},
    }
    got = handler_floor.summarize(phases, {"p50_ms": 5.9})
    assert math.isclose(got["inline"]["p50_minus_inprocess_ms"], 1.0)
    assert got["thread"]["p50_ms"] is None and got["thread"]["p50_minus_inprocess_ms"] is None
    assert math.isclose(handler_floor.summarize({"inline": answered}, {"p50_ms": 5.9})["inline"]["p50_minus_inprocess_ms"], 0.6)  # fmt: skip
