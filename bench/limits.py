"""Physical limits a target's throughput is measured against: the machine's theoretical peak and the best
matrix multiply ONNX Runtime's own kernels reach on it.

Theoretical peak, per precision (operations: a multiply-add counts 2):

    peak = cores x clock x ops_per_cycle_per_core

where cores are the ones the bench lets ONNX Runtime use (its `--threads`, capped by the physical cores),
the clock is the highest one the machine reports (sysfs `cpuinfo_max_freq`, else /proc/cpuinfo's
`cpu MHz`; a boost clock the OS does not report is not known, which is why the measured kernels are
checked against the figure: when one exceeds it, the peaks are taken at the lowest clock at which every
measured kernel fits, `fitted_to_kernels`), and ops per cycle come from the widest unit the CPU flags show,
in the table `UNITS` below (two units per core, as on every x86 server core since Haswell and Zen 1;
AMD's Zen 4 runs AVX-512 on 256-bit halves, so family 25 counts 256-bit).

Measured-kernel peak: one MatMul (fp32) and one DynamicQuantizeMatMul (int8 weights, the operator ORT's
dynamic quantization uses) per encoder shape, run by ONNX Runtime with the bench's thread count; the best
sustained rate over the shapes. Run in a child process (`python -m bertserve.bench.limits ...`) so its
thread pool never shares a process with the targets.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bertserve.bench.processes import BenchError, child_pythonpath
from bertserve.manifest import ModelDimensions


@dataclass(frozen=True)
class Unit:
    """The widest vector unit a CPU flag shows: fp32 and int8 multiply-adds per cycle of ONE unit."""

    flag: str
    fp32_macs: int  # fp32 lanes of one FMA
    int8_macs: int  # int8 multiply-adds of one instruction (dot-product units, or AVX2's vpmaddubsw)
    what: str


UNITS_PER_CORE = 2  # FMA pipes per x86 server core (Intel since Haswell, AMD since Zen 1): an upper bound
# Best first: the first unit whose flag the CPU has sets the int8 rate; fp32 comes from the first with FMA.
UNITS = (
    Unit("amx_int8", 16, 1024 // UNITS_PER_CORE, "AMX tiles (int8 1024 MACs/cycle/core), AVX-512 FMA"),
    Unit("avx512_vnni", 16, 64, "AVX-512 FMA and VNNI (vpdpbusd: 64 int8 MACs)"),
    Unit("avx_vnni", 8, 32, "256-bit FMA and AVX-VNNI (32 int8 MACs)"),
    Unit("avx512f", 16, 64, "AVX-512 FMA; int8 through vpmaddubsw (64 MACs)"),
    Unit("avx2", 8, 32, "256-bit FMA; int8 through vpmaddubsw (32 MACs)"),
    Unit("sse4_1", 4, 16, "128-bit SSE"),
)


def cpu_flags() -> tuple[set[str], str, int | None]:
    """(flags, vendor, family) from /proc/cpuinfo."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = set(re.search(r"^flags\s*:(.*)$", text, re.M).group(1).split()) if "flags" in text else set()
    vendor = (re.search(r"^vendor_id\s*:\s*(\S+)", text, re.M) or [None, ""])[1]
    family = re.search(r"^cpu family\s*:\s*(\d+)", text, re.M)
    return flags, vendor, int(family.group(1)) if family else None


def clock_ghz() -> tuple[float, str]:
    """The highest clock the OS reports, and where it came from."""
    sysfs = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if sysfs.exists():
        return int(sysfs.read_text()) / 1e6, "cpuinfo_max_freq"
    mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", Path("/proc/cpuinfo").read_text(), re.M)]
    if not mhz:
        raise BenchError("cannot tell the CPU clock (no cpufreq, no cpu MHz in /proc/cpuinfo)")
    return max(mhz) / 1000, "/proc/cpuinfo cpu MHz (boost clocks above it are not reported)"


def theoretical(cores: int) -> dict:
    flags, vendor, family = cpu_flags()
    ghz, clock_source = clock_ghz()
    return peaks(flags, vendor, family, ghz, cores) | {"clock_source": clock_source}


def peaks(flags: set[str], vendor: str, family: int | None, ghz: float, cores: int) -> dict:
    """The theoretical fp32 and int8 peaks of `cores` cores at `ghz` with these CPU flags."""
    unit = next((u for u in UNITS if u.flag in flags), None)
    if unit is None:
        raise BenchError("no known vector unit among the CPU flags")
    fp32_macs = unit.fp32_macs
    if vendor == "AuthenticAMD" and family == 25 and fp32_macs > 8:  # Zen 4: AVX-512 on 256-bit halves
        fp32_macs = 8
    per_cycle_fp32 = UNITS_PER_CORE * fp32_macs * 2
    per_cycle_int8 = UNITS_PER_CORE * unit.int8_macs * 2
    return {
        "cores": cores,
        "clock_ghz": round(ghz, 3),
        "unit": unit.what,
        "fp32_ops_per_cycle_per_core": per_cycle_fp32,
        "int8_ops_per_cycle_per_core": per_cycle_int8,
        "fp32_gflops": round(cores * ghz * per_cycle_fp32, 1),
        "int8_gops": round(cores * ghz * per_cycle_int8, 1),
        "formula": "cores x clock_ghz x units_per_core (2) x lanes x 2 (a multiply-add is 2 operations)",
    }


PER_CYCLE_KEYS = {"fp32": "fp32_ops_per_cycle_per_core", "int8": "int8_ops_per_cycle_per_core"}


def fitted_to_kernels(theory: dict, kernel: dict) -> dict:
    """`theory` (a CPU's peaks), at the lowest clock at which every measured kernel fits when the reported
    clock is below it: a VM's /proc/cpuinfo shows a base clock and the cores boost above it, so a peak at
    the reported clock is no limit. The clock is raised to the next MHz; `clock_source` says so."""
    needed = max(
        (kernel[PEAK_KEYS[p]] / (theory["cores"] * theory[key]) for p, key in PER_CYCLE_KEYS.items()
         if kernel.get(PEAK_KEYS[p])),
        default=0.0,
    )  # fmt: skip
    if needed <= theory["clock_ghz"]:
        return theory
    ghz = math.ceil(needed * 1000) / 1000
    fitted = {
        **theory,
        "clock_ghz": ghz,
        "clock_source": f"raised from {theory['clock_ghz']} GHz ({theory['clock_source']}): the lowest clock "
        "at which ONNX Runtime's measured kernels fit",
        "reported_clock_ghz": theory["clock_ghz"],
    }
    for p, key in PER_CYCLE_KEYS.items():
        fitted[PEAK_KEYS[p]] = math.ceil(10 * theory["cores"] * ghz * theory[key]) / 10
    return fitted


def _matmul_graph(m: int, k: int, n: int, int8: bool):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])
    if int8:
        weights = [
            numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "b"),
            numpy_helper.from_array(np.full((n,), 0.01, np.float32), "scale"),
            numpy_helper.from_array(np.zeros((n,), np.int8), "zero"),
        ]
        node = helper.make_node(
            "DynamicQuantizeMatMul", ["a", "b", "scale", "zero"], ["y"], domain="com.microsoft"
        )
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    else:
        weights = [numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "b")]
        node = helper.make_node("MatMul", ["a", "b"], ["y"])
        opsets = [helper.make_opsetid("", 17)]
    graph = helper.make_graph([node], "gemm", [a], [y], initializer=weights)
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()  # as gpu.py


def _sustained_gops(session, m: int, k: int, n: int, seconds: float) -> float:
    import numpy as np

    feed = {"a": np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)}
    session.run(None, feed)  # warm-up
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or calls < 3:
        session.run(None, feed)
        calls += 1
    return 2.0 * m * k * n * calls / elapsed / 1e9


def peaks_over_shapes(
    measure: Callable[[str, int, int, int], float],
    operators: dict[str, str],
    shapes: list[tuple[int, int, int]],
) -> dict:
    """GOP/s of `measure(precision, m, k, n)` for each precision of `operators` (precision -> the operator
    measured) on every shape: the best per precision under its PEAK_KEYS key, every shape's in `detail`."""
    out = {}
    for precision in operators:
        rates = {f"{m}x{k}x{n}": round(measure(precision, m, k, n), 2) for m, k, n in shapes}
        shape, best = max(rates.items(), key=lambda kv: kv[1])
        out[precision] = {"peak": best, "shape": shape, "by_shape": rates}
    return {PEAK_KEYS[p]: out[p]["peak"] for p in out} | {"operators": operators, "detail": out}


def measure_kernels(threads: int, hidden: int, intermediate: int, seconds_per_shape: float) -> dict:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")  # a kernel's best case
    shapes = [
        (rows, k, n)
        for rows in (512, 2048, 8192)
        for k, n in ((hidden, intermediate), (intermediate, hidden), (hidden, hidden))
    ]

    def measure(precision: str, m: int, k: int, n: int) -> float:
        graph = _matmul_graph(m, k, n, int8=precision == "int8")
        session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        return _sustained_gops(session, m, k, n, seconds_per_shape)

    operators = {"fp32": "MatMul", "int8": "com.microsoft.DynamicQuantizeMatMul"}
    return {"threads": threads} | peaks_over_shapes(measure, operators, shapes)


PEAK_KEYS = {"fp32": "fp32_gflops", "int8": "int8_gops", "fp16": "fp16_gflops"}  # precision -> limits key


def fractions(targets: dict[str, tuple[float | None, str]], limits: dict) -> dict:
    """Per target (rate in GOP/s, precision): its fraction of the theoretical and of the kernel peak (None
    where that peak is not known, e.g. a GPU missing from bench/gpu.py's table)."""
    rows = {}
    for name, (rate, precision) in targets.items():
        if rate is None:
            continue
        key = PEAK_KEYS[precision]
        theory, kernel = limits["theoretical"].get(key), limits["kernel"].get(key)
        rows[name] = {
            "precision": precision,
            "gops": round(rate, 2),
            "of_theoretical": round(rate / theory, 4) if theory else None,
            "of_kernel": round(rate / kernel, 4) if kernel else None,
        }
    return rows


def main() -> None:
    from bertserve.bench.gemm import child_arguments

    args = child_arguments(__doc__.splitlines()[0])
    if args.provider == "cuda":
        from bertserve.bench.gpu import measure_kernels as measure_on_gpu

        kernel = measure_on_gpu(args.hidden, args.intermediate, args.seconds_per_shape)
    else:
        kernel = measure_kernels(args.threads, args.hidden, args.intermediate, args.seconds_per_shape)
    json.dump(kernel, sys.stdout)
    sys.stdout.write("\n")


def measure_in_subprocess(
    threads: int, cores: int, dimensions: ModelDimensions, seconds_per_shape: float, provider: str = "cpu"
) -> dict:
    """{"theoretical": ..., "kernel": ...}: the CPU's (or, with provider cuda, GPU 0's) peaks; the kernels
    run in a child process pinned to `threads`."""
    from bertserve.bench.gemm import thread_environment

    argv = [sys.executable, "-m", "bertserve.bench.limits", "--threads", str(threads), "--hidden", str(dimensions.hidden_size),
            "--intermediate", str(dimensions.intermediate_size), "--seconds-per-shape", str(seconds_per_shape),
            "--provider", provider]  # fmt: skip
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=thread_environment(threads) | child_pythonpath(),
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"kernel peak measurement failed: {done.stderr.strip().splitlines()[-1:]}")
    warnings = []
    if provider == "cuda":
        from bertserve.bench.gpu import describe_gpu

        gpu = describe_gpu()
        theory = gpu["theoretical"]
        if not theory:
            warnings.append(f"{gpu['gpu']} is not in bench/gpu.py's table: no theoretical peak is given")
    else:
        theory = theoretical(min(threads, cores))
    kernel = json.loads(done.stdout)
    for precision, key in PEAK_KEYS.items():
        measured, bound = kernel.get(key), theory.get(key)
        if measured and bound and measured > bound:
            warnings.append(
                f"{precision}: ONNX Runtime's kernel reached {measured} above the theoretical {bound}: "
                "the device runs above the clock it reports"
            )
    if provider != "cuda" and (fitted := fitted_to_kernels(theory, kernel)) is not theory:
        theory = fitted
        warnings.append(f"the theoretical peaks use {theory['clock_ghz']} GHz instead")
    limits = {"theoretical": theory, "kernel": kernel}
    return limits | ({"warnings": warnings} if warnings else {})


if __name__ == "__main__":
    main()
