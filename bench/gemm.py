"""The machine's fp32 matrix-multiply peak at the encoder's shapes, with a given number of threads.

Run as a subprocess (`python -m bertserve.bench.gemm --threads N --hidden H --intermediate I`) so the BLAS
thread pools it starts never share the process with ONNX Runtime; prints one JSON object. The peak is
the best sustained GFLOP/s over the libraries available (torch, numpy) and the shapes an encoder multiplies:
(B*T, H) x (H, H), (B*T, H) x (H, I) and (B*T, I) x (I, H) for a few B*T.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bertserve.bench.processes import BenchError, child_pythonpath
from bertserve.manifest import ModelDimensions


def _sustained_gflops(matmul, make, m: int, k: int, n: int, seconds: float) -> float:
    """Mean rate over repeated multiplies for `seconds` (after one warm-up), not the best single one."""
    a, b = make(m, k), make(k, n)
    matmul(a, b)  # warm-up: thread pool start, page faults
    calls = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or calls < 3:
        matmul(a, b)
        calls += 1
    return 2.0 * m * k * n * calls / elapsed / 1e9


def measure(threads: int, hidden: int, intermediate: int, seconds_per_shape: float) -> dict:
    shapes = [
        (rows, k, n)
        for rows in (512, 2048, 8192)
        for k, n in ((hidden, hidden), (hidden, intermediate), (intermediate, hidden))
    ]
    results: dict[str, dict[str, float]] = {}

    import numpy as np

    def numpy_make(r, c):
        return np.random.default_rng(0).standard_normal((r, c), dtype=np.float32)

    results["numpy"] = {
        f"{m}x{k}x{n}": _sustained_gflops(np.matmul, numpy_make, m, k, n, seconds_per_shape)
        for m, k, n in shapes
    }
    try:
        import torch
    except ImportError:
        pass
    else:
        torch.set_num_threads(threads)

        def torch_make(r, c):
            return torch.randn(r, c, dtype=torch.float32)

        with torch.inference_mode():
            results["torch"] = {
                f"{m}x{k}x{n}": _sustained_gflops(torch.matmul, torch_make, m, k, n, seconds_per_shape)
                for m, k, n in shapes
            }
    library, shape, peak = max(
        ((lib, s, g) for lib, by_shape in results.items() for s, g in by_shape.items()), key=lambda x: x[2]
    )
    return {
        "threads": threads,
        "peak_gflops": round(peak, 2),
        "peak_library": library,
        "peak_shape": shape,
        "gflops": {lib: {s: round(g, 2) for s, g in v.items()} for lib, v in results.items()},
    }


def child_arguments(description: str) -> argparse.Namespace:
    """The arguments of a measuring child process (this module's and bench/limits.py's)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--intermediate", type=int, required=True)
    parser.add_argument("--seconds-per-shape", type=float, default=0.3)
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu")  # bench/limits.py only
    return parser.parse_args()


def main() -> None:
    args = child_arguments(__doc__.splitlines()[0])
    json.dump(measure(args.threads, args.hidden, args.intermediate, args.seconds_per_shape), sys.stdout)
    sys.stdout.write("\n")


def measure_in_subprocess(threads: int, dimensions: ModelDimensions, seconds_per_shape: float) -> dict:
    """Runs this module in a child process with its BLAS/OpenMP pools pinned to `threads`."""
    argv = [sys.executable, "-m", "bertserve.bench.gemm", "--threads", str(threads), "--hidden", str(dimensions.hidden_size),
            "--intermediate", str(dimensions.intermediate_size), "--seconds-per-shape", str(seconds_per_shape)]  # fmt: skip
    env = thread_environment(threads) | child_pythonpath()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise BenchError(f"GEMM measurement failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout)


def thread_environment(threads: int) -> dict[str, str]:
    """Environment that pins the BLAS and OpenMP pools of a child process to `threads`."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    return env


if __name__ == "__main__":
    main()
