"""`bertserve bench --provider cuda` on a machine without a GPU (CI never has one): the GPU peak table
against NVIDIA's published figures, nvidia-smi parsing, the target swap, and a clear refusal."""

from __future__ import annotations

import argparse

import pytest

from bertserve.bench import analysis, gpu, limits
from bertserve.bench.commands import register
from bertserve.bench.config import BenchConfig
from bertserve.bench.processes import BenchError

# (nvidia-smi name, then per precision the boost clock in MHz NVIDIA quotes that peak at and the dense
# TFLOP/s it quotes: tensor-core fp16, and fp32 as ONNX Runtime's CUDA provider runs it (TF32 tensor cores
# from Ampere on, CUDA cores before), from NVIDIA's data sheets and white papers; Hopper's tensor figures
# are quoted at 1830 MHz)
PUBLISHED = [
    ("NVIDIA H100 80GB HBM3", (1830, 989.4), (1830, 494.7)),
    ("NVIDIA H100 PCIe", (1620, 756.0), (1620, 378.0)),
    ("NVIDIA H200", (1830, 989.4), (1830, 494.7)),
    ("NVIDIA A100-SXM4-80GB", (1410, 312.0), (1410, 156.0)),
    ("NVIDIA A10", (1695, 125.0), (1695, 62.5)),
    ("NVIDIA L4", (2040, 121.0), (2040, 60.0)),
    ("NVIDIA L40S", (2520, 362.0), (2520, 183.0)),
    ("Tesla T4", (1590, 65.0), (1590, 8.1)),
    ("Tesla V100-SXM2-16GB", (1530, 125.0), (1530, 15.7)),
]
# CUDA-core fp32 (no tensor cores), quoted at the top boost clock
CUDA_CORE_FP32 = [
    ("NVIDIA H100 80GB HBM3", 1980, 66.9),
    ("NVIDIA A100-SXM4-80GB", 1410, 19.5),
    ("NVIDIA L4", 2040, 30.3),
]


@pytest.mark.parametrize(("name", "fp16", "fp32"), PUBLISHED)
def test_gpu_peak_table_matches_nvidias_published_figures(name, fp16, fp32):
    for key, (mhz, tflops) in (("fp16_gflops", fp16), ("fp32_gflops", fp32)):
        assert gpu.theoretical(name, mhz)[key] / 1e3 == pytest.approx(tflops, rel=0.02), key


@pytest.mark.parametrize(("name", "mhz", "tflops"), CUDA_CORE_FP32)
def test_cuda_core_fp32_peak_is_reported_beside_tf32(name, mhz, tflops):
    assert gpu.theoretical(name, mhz)["fp32_cuda_core_gflops"] / 1e3 == pytest.approx(tflops, rel=0.02)


def test_an_unknown_gpu_gets_no_theoretical_peak_and_fractions_say_so():
    assert gpu.theoretical("NVIDIA Made Up 9000", 2000) == {}
    physical = {"theoretical": {}, "kernel": {"fp16_gflops": 500.0, "fp32_gflops": 50.0}}
    rows = limits.fractions({"server-fp16": (250.0, "fp16")}, physical)
    assert rows["server-fp16"]["of_theoretical"] is None and rows["server-fp16"]["of_kernel"] == 0.5


def test_nvidia_smi_answer_is_read_as_name_and_clock():
    assert gpu.parse_nvidia_smi("NVIDIA H100 80GB HBM3, 1980\nNVIDIA H100 80GB HBM3, 1980\n") == (
        "NVIDIA H100 80GB HBM3",
        1980.0,
    )
    with pytest.raises(BenchError, match="NAME, MHZ"):
        gpu.parse_nvidia_smi("No devices were found\n")


def test_on_cuda_int8_gives_way_to_fp16_and_the_cpu_baseline_is_left_out(tmp_path):
    config = BenchConfig(model_repo=tmp_path, out=tmp_path, provider="cuda")
    assert analysis.SERVER_INT8 in config.targets and analysis.NAIVE in config.targets
    # the simulated device stays: it measures the fronts on the GPU machine's cores
    expected = [analysis.SERVER, analysis.SERVER_BS1, analysis.SERVER_FP16, analysis.SIMULATED_DEVICE]
    assert config.measured_targets == expected
    assert BenchConfig(model_repo=tmp_path, out=tmp_path).measured_targets == config.targets


def test_cuda_bench_without_a_usable_gpu_stops_at_once_with_the_reason(tmp_path, capsys):
    """This machine's onnxruntime has no CUDA provider (or onnxruntime-gpu without a GPU): exit 1 and say
    why, before any model is loaded or measured."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "bench",
            "--model-repo",
            str(tmp_path / "none"),
            "--out",
            str(tmp_path / "out"),
            "--provider",
            "cuda",
        ]
    )
    assert args.run(args) == 1
    error = capsys.readouterr().err
    assert "--provider cuda" in error and ("no CUDA provider" in error or "got" in error)
    assert not (tmp_path / "out" / "bench.json").exists()


def test_the_kernel_graphs_are_readable_by_every_allowed_onnxruntime():
    """onnx >= 1.23 writes IR version 14 by default, which onnxruntime-gpu 1.31 refuses ("max supported IR
    version: 13", seen on an H100 machine): the bench's MatMul graphs say IR 10 (onnxruntime >= 1.20)."""
    import onnx

    from bertserve.bench import gpu

    for fp16 in (False, True):
        assert onnx.load_from_string(gpu._matmul_graph(8, 8, 8, fp16)).ir_version == 10
    for int8 in (False, True):  # the CPU kernels' graphs, run by onnxruntime-gpu's CPU provider too
        assert onnx.load_from_string(limits._matmul_graph(8, 8, 8, int8)).ir_version == 10


@pytest.mark.parametrize("provider", ["cpu", "cuda"])
def test_every_bertserve_target_is_told_its_provider(tiny_repo, tmp_path, provider):
    """Never "auto": on a GPU machine a CPU bench measured server-fp32 on the GPU (seen on an H100)."""
    from bertserve.bench.model_setup import resolve_model
    from bertserve.bench.runner import _servers

    model = resolve_model(tiny_repo, "tiny-embed", None, tmp_path, lambda _: None)
    config = BenchConfig(
        model_repo=tiny_repo, out=tmp_path, provider=provider, targets=list(analysis.TARGETS)
    )
    servers = _servers(config, model, tmp_path)
    bertserve = [s for name, s in servers.items() if name != analysis.NAIVE]
    assert bertserve and all(s.env["BERTSERVE_PROVIDER"] == provider for s in bertserve)


def test_on_cuda_phases_repeat_the_corpus_until_every_caller_sends_enough(tmp_path, monkeypatch):
    """A GPU answers a quick run's corpus in a tenth of a second, in fewer requests than c=256 callers: the
    first H200 check's phases lasted 50-100 ms and read a quarter of the steady rate."""
    import asyncio
    from types import SimpleNamespace

    from bertserve.bench import runner
    from bertserve.bench.loadgen import Request
    from bertserve.bench.targets import TargetRun, Workload

    configs = []

    async def capture(config):
        configs.append(config)

    monkeypatch.setattr(runner, "run", capture)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    for provider in ("cuda", "cpu"):
        args = parser.parse_args(["bench", "--quick", "--model-repo", str(tmp_path), "--out", str(tmp_path)])
        args.provider = provider
        assert args.run(args) == 0
    assert (configs[0].min_requests_per_caller, configs[0].min_open_s, configs[0].ceiling_min_s) == (
        gpu.MIN_REQUESTS_PER_CALLER,
        gpu.MIN_OPEN_S,
        gpu.MIN_CEILING_S,
    )
    assert (configs[0].loadgen_threads, configs[1].loadgen_threads) == (gpu.LOADGEN_THREADS, 1)
    args = parser.parse_args(["bench", "--quick", "--model-repo", str(tmp_path), "--out", str(tmp_path),
                              "--loadgen-threads", "2"])  # fmt: skip
    args.provider = "cuda"
    assert args.run(args) == 0 and configs[2].loadgen_threads == 2  # asked for: over the GPU's default
    cpu = configs[1]
    assert (cpu.min_requests_per_caller, cpu.min_open_s, cpu.ceiling_min_s) == (
        0,
        0.0,
        0.0,
    )  # the corpus once

    corpus = [Request([f"t{i}"], 1, 1.0) for i in range(3)]
    workload = Workload([4], corpus, corpus, 0.7, min_requests_per_caller=5, min_open_s=0.5)
    server = SimpleNamespace(protocol="grpc", name="s")
    target = TargetRun(server, "m", workload, log=lambda _: None)
    sent = []

    async def call(texts):
        sent.extend(texts)

    target.call = call
    closed = asyncio.run(target._load(corpus, "closed", None, concurrency=4).measure())
    assert closed.requests_planned == 20 and len(sent) == 20 and set(sent) == {"t0", "t1", "t2"}
    opened = asyncio.run(target._load(corpus, "open", None, rate=40.0).measure())
    assert opened.requests_planned == 20  # 0.5 s at 40 requests/s


def test_nvidia_smis_compute_apps_are_read_as_memory_per_process():
    answer = "1234, 2871\n5678, 512\n1234, 10\n"
    assert gpu.parse_compute_apps(answer) == {1234: 2881.0, 5678: 512.0}
    assert gpu.parse_compute_apps("No running processes found\n") == {}


def test_a_servers_gpu_memory_is_its_own_processes_and_none_without_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '1234, 2871\\n5678, 512\\n42, 7\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu.processes_memory_mib([1234, 42, 999]) == 2878.0  # the bench's own process (5678) left out
    assert gpu.processes_memory_mib([999]) is None
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert gpu.processes_memory_mib([1234]) is None
