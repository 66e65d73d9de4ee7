"""The Python steps of `make gpu-check` (scripts/gpu-check.sh), run as `python -m bertserve.bench.gpu_check`:

- `sanity`: ONNX Runtime really runs on the GPU (a GPU build, and a session that got the CUDA provider);
- `device-dir`: the folder name for this GPU's results (docs/performance/gpu-h100 for an H100);
- `library-path`: the lib folders of NVIDIA's pip packages (cuBLAS, cuDNN, ...) for LD_LIBRARY_PATH, since
  onnxruntime-gpu does not find them by itself in a virtual environment;
- `summary OUT`: the issue's GPU goals side by side for each run under OUT/workers-*/bench.json, and the
  many-core goal from OUT/cpu/bench.json when there;
- `native DIR`: the native gRPC transport and the bench's load generators, built here (or found in the cache)
  and copied into DIR under their cache names, for a GPU machine without a compiler (`make gpu-bundle`).

A failed `sanity` prints one line and exits NO_GPU, as the script does for a machine without nvidia-smi.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from bertserve.bench import analysis, gpu, native_loadgen
from bertserve.bench.processes import BenchError
from bertserve.service.engine import native_wordpiece
from bertserve.service.grpc.native import transport
from bertserve.service.native_build import NativeUnavailable

NO_GPU = 3  # the exit code for "no usable GPU" (scripts/gpu-check.sh uses the same)
RUN_PREFIX = "workers-"
CPU_RUN = "cpu"  # the many-core run's folder (scripts/gpu-check.sh, phase cpu)
SINGLE_CONCURRENCY = 256  # the single-input figure: callers at c=256


def _many_cores_goal(v: float) -> bool:
    return v >= 0.9  # issue 26: on a GPU machine's CPU cores, single-input callers >= 0.9x bulk


def device_dir(name: str) -> str:
    """`gpu-` and the GPU's model from bench/gpu.py's table (`gpu-h100`, `gpu-h100-pcie`), or else its
    name reduced to letters, digits and dashes, without the vendor."""
    model = next((g for g in gpu.GPUS if g.key.lower() in name.lower()), None)
    base = model.key if model else re.sub(r"(?i)\bnvidia\b", "", name)
    slug = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")
    if not slug:
        raise BenchError(f"cannot name a folder after the GPU {name!r}")
    return f"gpu-{slug}"


def library_path() -> str:
    """The folders holding shared libraries of the `nvidia` pip packages (empty without them)."""
    try:
        import nvidia  # namespace package of nvidia-cublas, nvidia-cudnn-cu13, ... (torch's CUDA build)
    except ImportError:
        return ""
    found = {
        str(lib) for root in nvidia.__path__ for lib in Path(root).glob("**/lib") if any(lib.glob("*.so*"))
    }
    return ":".join(sorted(found))


def sanity() -> str:
    """One line saying what runs on the GPU; BenchError with the reason when nothing usable does."""
    try:
        import onnx  # noqa: F401  (require_cuda builds its test graph with it)
        import onnxruntime as ort
    except ImportError as error:
        raise BenchError(f"{error} (install the export extra and onnxruntime-gpu)") from None
    described = gpu.describe_gpu()
    if ort.get_device() != "GPU":
        raise BenchError(
            f"onnxruntime {ort.__version__} is a CPU build (get_device() says {ort.get_device()}): "
            "install onnxruntime-gpu in its place"
        )
    gpu.require_cuda()
    return f"{described['gpu']}: onnxruntime {ort.__version__} (get_device() GPU) ran a session on {gpu.CUDA}"


def _closed_phase(bench: dict, target: str, concurrency: int) -> dict:
    phases = bench.get("targets", {}).get(target, {}).get("closed") or []
    return next((p for p in phases if p.get("concurrency") == concurrency), {})


def _closed_at(bench: dict, target: str, concurrency: int, key: str = "inputs_per_s") -> float | None:
    return _closed_phase(bench, target, concurrency).get(key)


def _ceiling(bench: dict, precision: str) -> float | None:
    return bench.get("inprocess", {}).get(precision, {}).get("mixed", {}).get("inputs_per_s")


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def _find(value: object, key: str) -> float | None:
    """The first `key` anywhere in bench.json (figures a newer bench adds, such as front_cpu_ms_per_call)."""
    if isinstance(value, dict):
        if isinstance(value.get(key), int | float):
            return float(value[key])
        children = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return None
    return next((found for child in children if (found := _find(child, key)) is not None), None)


def _server(bench: dict, key: str) -> object:
    """server-fp32's own figure `key` in bench.json (None where that bench did not record it)."""
    return bench.get("targets", {}).get(analysis.SERVER, {}).get(key)


# (figure, goal as text, the test of the goal or None for a figure without one, how bench.json gives it)
FIGURES: list[tuple[str, str, Callable[[float], bool] | None, Callable[[dict], float | None]]] = [
    (
        f"server-fp16, single-input callers at c={SINGLE_CONCURRENCY} / fp16 in-process ceiling",
        ">= 0.5",
        lambda v: v >= 0.5,
        lambda b: _ratio(_closed_at(b, analysis.SERVER_FP16, SINGLE_CONCURRENCY), _ceiling(b, "fp16")),
    ),
    (
        "server-fp32, 32-input requests / fp32 in-process ceiling",
        ">= 0.8",
        lambda v: v >= 0.8,
        lambda b: _ratio(
            b.get("per_call_profile", {}).get("bulk", {}).get("inputs_per_s"), _ceiling(b, "fp32")
        ),
    ),
    (
        "server-fp16 / server-fp32 (saturation)",
        ">= 1.3",
        lambda v: v >= 1.3,
        lambda b: b.get("ratios", {}).get("fp16_vs_server_fp32"),
    ),
    (
        "HTTP /bertserve/v1/embed / gRPC, single input (saturation)",
        ">= 0.8",
        lambda v: v >= 0.8,
        lambda b: b.get("ratios", {}).get("http_vs_grpc"),
    ),
    (
        f"server-fp16 inputs/s at c={SINGLE_CONCURRENCY}",
        "",
        None,
        lambda b: _closed_at(b, analysis.SERVER_FP16, SINGLE_CONCURRENCY),
    ),
    (
        f"server-fp32 inputs/s at c={SINGLE_CONCURRENCY}",
        "",
        None,
        lambda b: _closed_at(b, analysis.SERVER, SINGLE_CONCURRENCY),
    ),
    ("fp16 in-process ceiling, inputs/s", "", None, lambda b: _ceiling(b, "fp16")),
    *(
        (
            f"server-fp32 server CPU cores at c={c}",
            "",
            None,
            lambda b, c=c: _closed_at(b, analysis.SERVER, c, "server_cpu_cores"),
        )
        for c in (1, SINGLE_CONCURRENCY)
    ),
    *(
        (
            f"server-fp32 {what} ms per batch (c={SINGLE_CONCURRENCY})",
            "",
            None,
            lambda b, key=key: (
                _closed_phase(b, analysis.SERVER, SINGLE_CONCURRENCY).get("server") or {}
            ).get(key),
        )
        for what, key in (
            ("compute", "inference_ms_mean"),
            ("ONNX Runtime's run", "encoder_run_ms_mean"),
            ("wall time", "batch_cycle_ms"),
        )
    ),
    (
        "server-fp32 GPU memory MiB (its processes, after its phases)",
        "",
        None,
        lambda b: _server(b, "gpu_memory_mib"),
    ),
    *(
        (
            f"server-fp32 batch cost line, {what} (batch_cut cost)",
            "",
            None,
            lambda b, key=key: (_server(b, "batch_cost") or {}).get(key),  # None: cut by padding
        )
        for what, key in (("ms per batch", "fixed_ms"), ("us per padded token", "token_us"))
    ),
    ("front CPU ms per single-input call", "", None, lambda b: _find(b, "front_cpu_ms_per_call")),
    ("native port CPU ms per single-input call", "", None, lambda b: _find(b, "native_cpu_ms_per_call")),
]


def _cell(value: float | None, test: Callable[[float], bool] | None) -> str:
    if value is None:
        return "–"
    shown = f"{value:.3f}" if abs(value) < 100 else f"{value:,.0f}"
    if test is None:
        return shown
    return f"{shown} ({'met' if test(value) else 'not met'})"


def summarize(out: Path) -> dict:
    """Figures of every run under `out` (workers-1, workers-auto, ...); writes gpu-check.json and .md."""
    runs = {
        path.parent.name.removeprefix(RUN_PREFIX): json.loads(path.read_text())
        for path in sorted(out.glob(f"{RUN_PREFIX}*/bench.json"))
    }
    if not runs:
        raise BenchError(f"no {RUN_PREFIX}*/bench.json under {out}")
    figures = {workers: {name: how(bench) for name, _, _, how in FIGURES} for workers, bench in runs.items()}
    first = next(iter(runs.values()))
    machine = first.get("machine", {})
    gpu_name = machine.get("gpu", {}).get("gpu", "unknown GPU")
    versions = machine.get("versions", {})
    onnxruntime = versions.get("onnxruntime (imported)") or versions.get("onnxruntime-gpu") or "?"
    dates = sorted(bench.get("created_at", "?") for bench in runs.values())  # runs kept from earlier checks
    when = dates[0] if dates[0] == dates[-1] else f"runs from {dates[0]} to {dates[-1]}"
    lines = [
        f"# GPU check: {gpu_name}",
        "",
        f"`make gpu-check` (scripts/gpu-check.sh): `bertserve bench --provider cuda --quick` once per workers "
        f"setting. {machine.get('cpu', '?')}, {machine.get('logical_cores', '?')} logical cores; onnxruntime "
        f"{onnxruntime}; {when}. Each run's own report: "
        + ", ".join(f"[workers {w}]({RUN_PREFIX}{w}/bench.md)" for w in runs)
        + ".",
        "",
        "| figure | goal | " + " | ".join(f"workers {w}" for w in runs) + " |",
        "| --- | --- | " + " | ".join("---" for _ in runs) + " |",
    ]
    for name, goal, test, _ in FIGURES:
        cells = " | ".join(_cell(figures[w][name], test) for w in runs)
        lines.append(f"| {name} | {goal or '–'} | {cells} |")
    lines += _busiest_text(runs)
    cpu = _cpu_figure(out / CPU_RUN / "bench.json")
    if cpu is not None:
        lines += ["", f"On the CPU provider ([cpu]({CPU_RUN}/bench.md), {cpu['cores']} logical cores, "
                  f"{cpu['settings']}): single-input callers / 32-input requests {_cell(cpu['single_vs_bulk'], _many_cores_goal)}, "
                  "goal >= 0.9."]  # fmt: skip
    (out / "gpu-check.md").write_text("\n".join(lines) + "\n")
    summary = {"gpu": gpu_name, "onnxruntime": onnxruntime, "figures": figures, "cpu": cpu}
    (out / "gpu-check.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _busiest_text(runs: dict[str, dict]) -> list[str]:
    """Each run's three busiest threads in server-fp32's phases at c=1 and c=SINGLE_CONCURRENCY."""
    lines = []
    for workers, bench in runs.items():
        for c in (1, SINGLE_CONCURRENCY):
            threads = _closed_phase(bench, analysis.SERVER, c).get("busiest_threads") or []
            named = ", ".join(
                f"{t['process']}/{t['thread']} ({t['threads']}) {t['cores']:.2f}" for t in threads[:3]
            )
            if named:
                lines.append(f"- workers {workers}, server-fp32 at c={c}: {named} cores")
    return ["", "Busiest threads (process/thread (how many), cores kept busy):", "", *lines] if lines else []


def _cpu_figure(path: Path) -> dict | None:
    """The many-core run's single-input / 32-input ratio (its per-call profile), None without the run."""
    if not path.is_file():
        return None
    bench = json.loads(path.read_text())
    chosen = bench.get("settings", {}).get("server_settings", {})
    return {
        "cores": bench.get("machine", {}).get("logical_cores"),
        "settings": ", ".join(f"{k} {v}" for k, v in chosen.items()) or "defaults",
        "single_vs_bulk": bench.get("ratios", {}).get("single_vs_bulk"),
    }


def native_code(into: Path) -> list[Path]:
    """`native DIR`: the copies made (the transport's and the WordPiece's libraries, the gRPC and HTTP load
    generators)."""
    try:
        transport.library()
        native_wordpiece.library()
        built = [
            transport.library_file(),
            native_wordpiece.library_file(),
            native_loadgen.find_binary(),
            native_loadgen.http_binary(),
        ]
    except NativeUnavailable as why:
        raise BenchError(f"no native code: {why}") from None
    if built[-1] is None:
        raise BenchError("no native code: the HTTP load generator cannot be built here")
    into.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(path, into / path.name)) for path in built]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bertserve.bench.gpu_check", description=__doc__)
    steps = parser.add_subparsers(dest="step", required=True)
    steps.add_parser("sanity")
    named = steps.add_parser("device-dir")
    named.add_argument("--name", help="the GPU's name (default: nvidia-smi's)")
    steps.add_parser("library-path")
    summary = steps.add_parser("summary")
    summary.add_argument("out", type=Path)
    steps.add_parser("native").add_argument("into", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.step == "sanity":
            print(sanity())
        elif args.step == "device-dir":
            print(device_dir(args.name or gpu.describe_gpu()["gpu"]))
        elif args.step == "library-path":
            print(library_path())
        elif args.step == "native":
            print("\n".join(str(path) for path in native_code(args.into)))
        else:
            summarize(args.out)
            print(args.out / "gpu-check.md")
    except BenchError as error:
        reason = f"no usable GPU: {error}" if args.step == "sanity" else str(error)
        print(f"gpu-check: {reason}", file=sys.stderr)
        return NO_GPU if args.step == "sanity" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
