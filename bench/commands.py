"""`bertserve bench`: registered with the console script (see bertserve/cli.py)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path


def _default_threads() -> int:
    """One per physical core this process may use (ONNX Runtime's own default is one per physical core)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        import psutil
    except ImportError:
        return usable
    return max(1, min(psutil.cpu_count(logical=False) or usable, usable))


def _concurrency(value: str) -> list[int]:
    levels = [int(v) for v in value.split(",") if v.strip()]
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("expected positive integers separated by commas, e.g. 1,4,16,64")
    return levels


def _positive(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError("expected a number above 0")
    return number


def _targets(value: str) -> list[str]:
    from bertserve.bench.analysis import TARGETS

    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown target(s) {unknown}; choose from {','.join(TARGETS)}")
    return names


def _setting(value: str) -> tuple[str, str]:
    key, sep, setting = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError("expected NAME=VALUE, e.g. max_queue_delay_ms=1")
    return key.strip().lower(), setting


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark the server against same-run baselines",
        description="Closed-loop sweep and open loop against bertserve (fp32, batching off, int8) and a naive "
        "transformers server, with the in-process ONNX Runtime ceiling and the GEMM peak measured in the same "
        "run. Writes bench.json, bench.md and PNG plots into --out.",
    )
    parser.add_argument(
        "--model-repo", type=Path, required=True, help="model repository (bertserve export --out)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="directory for bench.json, bench.md, *.png, logs/"
    )
    parser.add_argument(
        "--model", help="model name in the repository (default: the first with the embed task)"
    )
    parser.add_argument(
        "--checkpoint", type=Path, help="Hugging Face checkpoint the model came from (naive baseline)"
    )
    parser.add_argument("--quick", action="store_true", help="a short run (under 3 minutes on 2 cores)")
    parser.add_argument("--threads", type=int, default=_default_threads(), help="threads for every target")
    parser.add_argument("--concurrency", type=_concurrency, help="closed-loop levels (default 1,4,16,64)")
    parser.add_argument("--texts", type=int, help="mixed-corpus texts per phase (default 1000, quick 160)")
    parser.add_argument(
        "--fixed-length", type=int, default=128, help="tokens per text in the fixed-length phase"
    )
    parser.add_argument(
        "--fixed-texts", type=int, help="fixed-length texts per phase (default 128, quick 32)"
    )
    parser.add_argument("--inputs-per-request", type=int, help="texts per Embed call (default 1)")
    parser.add_argument(
        "--rate", type=_positive, help="open-loop requests/s (default 0.7 x server-fp32 saturation)"
    )
    parser.add_argument(
        "--targets",
        type=_targets,
        help="comma-separated subset of server-fp32,server-fp32-http,server-fp32-bs1,server-int8,server-fp16,"
        "naive-fp32,simulated-device (default: all but server-fp32-http and server-fp16; with --provider cuda "
        "server-int8 becomes server-fp16 and naive-fp32 is left out). simulated-device: single-input callers "
        "against a server whose device answers each batch after 1 ms of sleep, with workers 1, 2 and auto",
    )
    parser.add_argument(
        "--provider",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: in-process ceilings (I/O binding), kernels and servers on ONNX Runtime's CUDA provider, the "
        "fp16 graph instead of int8, and the GPU's dense fp16 peak (needs onnxruntime-gpu and a GPU)",
    )
    parser.add_argument(
        "--loadgen",
        choices=("native", "python"),
        default="native",
        help="what sends the gRPC targets' requests: native, a C++ client built on first use (bench/native, "
        "needs g++ and libgrpc++-dev; the Python client when it cannot be built) or python, grpc.aio in the "
        "bench's process, which takes more of the cores it shares with the server",
    )
    parser.add_argument(
        "--connections",
        choices=("one", "per-caller"),
        default="one",
        help="gRPC connections of the sweep's callers: one shared by all, or one per caller as independent "
        "clients open (needed to spread calls over a server's front processes, workers > 1; the "
        "simulated-device target always uses per-caller)",
    )
    parser.add_argument(
        "--loadgen-threads",
        type=int,
        default=None,
        help="threads of the native gRPC client's closed phases, its connections shared out over them "
        "(default 1; with --provider cuda 4)",
    )
    parser.add_argument(
        "--front",
        choices=("main", "native"),
        default="main",
        help="where the gRPC bertserve targets' Embed calls go: main, the gRPC port (grpc.aio unless "
        "--server-setting grpc_transport=native), or native, the native port (gRPC's C++ server)",
    )
    parser.add_argument(
        "--server-setting", type=_setting, action="append", default=[], metavar="NAME=VALUE",
        help="extra bertserve setting for the bertserve targets (repeatable), e.g. max_queue_delay_ms=1",
    )  # fmt: skip
    parser.add_argument(
        "--cores",
        type=_concurrency,
        help="instead of the sweep: server-fp32 pinned to each of these core counts (e.g. 1,2,4,8,16) in two "
        "instance layouts (1 x k threads, k x 1), with the in-process ceiling pinned alike; writes scaling.json, "
        "scaling.md and scaling.png (bench/scaling.py)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        from bertserve.bench.config import BenchConfig
        from bertserve.bench.runner import run
    except ImportError as error:
        print(f"bertserve bench: {error}; the bench needs the export and dev extras "
              "(pip install -e '.[export,dev]')", file=sys.stderr)  # fmt: skip
        return 1

    if args.cores:
        return _run_scaling(args)
    overrides = {
        "concurrency": args.concurrency,
        "texts": args.texts,
        "fixed_texts": args.fixed_texts,
        "fixed_length": args.fixed_length,
        "inputs_per_request": args.inputs_per_request,
        "open_rate": args.rate,
        "targets": args.targets,
        "loadgen_threads": args.loadgen_threads,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    settings = dict(args.server_setting)
    if args.provider == "cuda":
        from bertserve.bench import gpu

        settings = gpu.SERVER_SETTINGS | settings
        overrides = {
            "concurrency": gpu.CONCURRENCY,
            "ceiling_batch_sizes": gpu.CEILING_BATCH_SIZES,
            "min_requests_per_caller": gpu.MIN_REQUESTS_PER_CALLER,
            "min_open_s": gpu.MIN_OPEN_S,
            "ceiling_min_s": gpu.MIN_CEILING_S,
            "loadgen_threads": gpu.LOADGEN_THREADS,
        } | overrides
    common = dict(model_repo=args.model_repo, out=args.out, model=args.model, checkpoint=args.checkpoint,
                  threads=args.threads, server_settings=settings, provider=args.provider,
                  loadgen=args.loadgen, connections=args.connections, front=args.front)  # fmt: skip
    config = (
        BenchConfig.quick_preset(**common, **overrides) if args.quick else BenchConfig(**common, **overrides)
    )
    return _exit_code(run(config))


def _exit_code(run) -> int:
    """Runs the bench coroutine `run`: 0, or 1 with its one-line reason for a BenchError."""
    from bertserve.bench.processes import BenchError

    try:
        asyncio.run(run)
    except BenchError as error:
        print(f"bertserve bench: {error}", file=sys.stderr)
        return 1
    return 0


def _run_scaling(args: argparse.Namespace) -> int:
    from bertserve.bench.scaling import ScalingConfig, run

    config = ScalingConfig(
        args.model_repo,
        args.out,
        args.cores,
        model=args.model,
        phase_seconds=4.0 if args.quick else 10.0,
        server_settings=dict(args.server_setting),
        loadgen=args.loadgen,
    )
    return _exit_code(run(config))
