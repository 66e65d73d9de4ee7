"""`bertserve bench --provider cuda`: the GPU's physical limits and ONNX Runtime sessions on its CUDA provider.

Theoretical dense peak of an NVIDIA GPU, per precision (a multiply-add counts 2 operations):

    peak = SMs x max SM clock x operations per clock per SM

SMs and the per-SM rates come from the table `GPUS` below (NVIDIA's architecture white papers: dense
tensor-core fp16 with fp32 accumulation, and plain fp32 on the CUDA cores); the clock is the maximum SM
clock `nvidia-smi` reports for the device (its boost clock). A GPU missing from the table gets no
theoretical figure, said so in the notes, rather than a guess.

Measured-kernel peak: one MatMul per shape in fp16 and fp32 on ONNX Runtime's CUDA provider (cuBLAS),
inputs and outputs bound on the device (I/O binding), so the figure is the GEMM alone.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from dataclasses import dataclass

from bertserve.bench.limits import peaks_over_shapes
from bertserve.bench.processes import BenchError

CUDA = "CUDAExecutionProvider"


@dataclass(frozen=True)
class GpuModel:
    """One GPU model: matched when `key` is in the name nvidia-smi reports (first match in table order)."""

    key: str
    architecture: str
    sms: int
    fp16_tensor_flops_per_clock_per_sm: int  # dense, fp32 accumulation
    fp32_flops_per_clock_per_sm: int  # CUDA cores x 2

    @property
    def tf32_tensor_flops_per_clock_per_sm(self) -> int:
        """Dense TF32 on the tensor cores (Ampere and later: half the fp16 rate; none before)."""
        return self.fp16_tensor_flops_per_clock_per_sm // 2 if self.architecture in TF32_ARCHITECTURES else 0


TF32_ARCHITECTURES = ("Ampere", "Ada", "Hopper")

# More specific names first ("GH200" before "H200", "A100" before "A10", "L40S" before "L4").
GPUS = (
    GpuModel("H100 PCIe", "Hopper", 114, 4096, 256),
    GpuModel("GH200", "Hopper", 132, 4096, 256),
    GpuModel("H200", "Hopper", 132, 4096, 256),
    GpuModel("H100", "Hopper", 132, 4096, 256),  # SXM5 and NVL
    GpuModel("A100", "Ampere", 108, 2048, 128),
    GpuModel("A10", "Ampere", 72, 1024, 256),
    GpuModel("L40S", "Ada", 142, 1024, 256),
    GpuModel("L4", "Ada", 58, 1024, 256),
    GpuModel("T4", "Turing", 40, 1024, 128),
    GpuModel("V100", "Volta", 80, 1024, 128),
)

# What the bench changes with --provider cuda, where a GPU wants larger batches than a CPU: the servers get
# the GPU overlay's batch settings (deploy/kubernetes/overlays/gpu; a test keeps the two the same) unless
# --server-setting says otherwise, the ceilings try batches up to the servers' largest, and the sweep
# goes to higher concurrency.
SERVER_SETTINGS = {
    "intra_op_threads": "1",
    "max_batch_size": "64",
    "max_batch_tokens": "16384",
    "max_queue_inputs": "2048",
    "max_padding_ratio": "4",
}
CEILING_BATCH_SIZES = [1, 8, 32, 64]
CONCURRENCY = [1, 16, 64, 256]
# a GPU answers the corpus of a quick run in a tenth of a second, fewer requests than c=256 callers: its
# phases repeat the corpus, so that each caller sends this many requests and an open phase lasts this long
MIN_REQUESTS_PER_CALLER = 32
MIN_OPEN_S = 2.0
# a ceiling pass lasts a few ms there, and two can both fall in one disturbance: the fastest of this long's
MIN_CEILING_S = 0.3
# one thread of the native load generator kept 0.7-0.85 of a core busy at c=256 on an H200 server: the
# closed phases spread their connections over this many (of 16 cores)
LOADGEN_THREADS = 4

NVIDIA_SMI_QUERY = ["--query-gpu=name,clocks.max.sm", "--format=csv,noheader,nounits"]


def parse_nvidia_smi(output: str) -> tuple[str, float]:
    """(name, max SM clock in MHz) of the first GPU in `nvidia-smi --query-gpu=name,clocks.max.sm` CSV."""
    line = next((line for line in output.splitlines() if line.strip()), "")
    name, _, mhz = line.rpartition(",")
    try:
        return name.strip(), float(mhz)
    except ValueError:
        raise BenchError(f"cannot read nvidia-smi's answer {line!r} as NAME, MHZ") from None


def theoretical(name: str, mhz: float) -> dict:
    """The dense fp16 (tensor cores) and fp32 peaks of the GPU `name` at `mhz`; {} for a GPU not in GPUS."""
    model = next((g for g in GPUS if g.key.lower() in name.lower()), None)
    if model is None:
        return {}
    ghz = mhz / 1000
    fp32_per_clock = max(model.fp32_flops_per_clock_per_sm, model.tf32_tensor_flops_per_clock_per_sm)
    return {
        "gpu": name,
        "architecture": model.architecture,
        "sms": model.sms,
        "clock_ghz": round(ghz, 3),
        "clock_source": "nvidia-smi clocks.max.sm",
        "fp16_ops_per_clock_per_sm": model.fp16_tensor_flops_per_clock_per_sm,
        "fp32_ops_per_clock_per_sm": fp32_per_clock,
        "fp16_gflops": round(model.sms * ghz * model.fp16_tensor_flops_per_clock_per_sm, 1),
        # ONNX Runtime's CUDA provider runs fp32 MatMul on the TF32 tensor cores where there are some (its
        # use_tf32 default): on an H100 its fp32 MatMul reached 350 TFLOP/s, over 5x the CUDA cores' peak
        "fp32_gflops": round(model.sms * ghz * fp32_per_clock, 1),
        "fp32_cuda_core_gflops": round(model.sms * ghz * model.fp32_flops_per_clock_per_sm, 1),
        "formula": "SMs x clock_ghz x operations per clock per SM (dense fp16 tensor cores, fp32 accumulate; "
        "fp32: TF32 tensor cores from Ampere on, else CUDA cores x 2)",
    }


NVIDIA_SMI_APPS = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def parse_compute_apps(output: str) -> dict[int, float]:
    """pid -> MiB of GPU memory from `nvidia-smi --query-compute-apps=pid,used_memory` CSV (lines that are
    not "PID, MIB", such as "No running processes found", skipped)."""
    held: dict[int, float] = {}
    for line in output.splitlines():
        pid, _, mib = line.partition(",")
        with contextlib.suppress(ValueError):
            held[int(pid)] = held.get(int(pid), 0.0) + float(mib)
    return held


def processes_memory_mib(pids: list[int]) -> float | None:
    """GPU memory held by these processes, in MiB; None where nvidia-smi is absent or fails, or lists none of
    them (no GPU session, or a container whose processes it cannot see)."""
    smi = shutil.which("nvidia-smi")
    if smi is None or not pids:
        return None
    done = subprocess.run([smi, *NVIDIA_SMI_APPS], capture_output=True, text=True, check=False, timeout=30)
    held = parse_compute_apps(done.stdout) if done.returncode == 0 else {}
    ours = [held[pid] for pid in pids if pid in held]
    return sum(ours) if ours else None


def describe_gpu() -> dict:
    """nvidia-smi's name and clock of GPU 0 and the theoretical peaks ({} peaks for an unknown model)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise BenchError("--provider cuda: nvidia-smi is not on PATH, so there is no NVIDIA GPU to measure")
    done = subprocess.run([smi, *NVIDIA_SMI_QUERY], capture_output=True, text=True, check=False, timeout=30)
    if done.returncode != 0:
        raise BenchError(f"--provider cuda: nvidia-smi failed: {done.stderr.strip()[-300:]}")
    name, mhz = parse_nvidia_smi(done.stdout)
    return {"gpu": name, "max_sm_clock_mhz": mhz, "theoretical": theoretical(name, mhz)}


def require_cuda() -> None:
    """Fails early, with the reason, unless ONNX Runtime really runs a graph (a small MatMul) on CUDA here."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if CUDA not in available:
        raise BenchError(
            f"--provider cuda: this onnxruntime has no CUDA provider (available: {available}); install "
            "onnxruntime-gpu (pip install -e '.[gpu]') on a machine with an NVIDIA GPU"
        )
    session = ort.InferenceSession(_matmul_graph(8, 8, 8, False), providers=[CUDA, "CPUExecutionProvider"])
    if session.get_providers()[0] != CUDA:  # onnxruntime-gpu lists CUDA even where it cannot run
        raise BenchError(
            f"--provider cuda: a session asked for CUDA got {session.get_providers()} "
            "(no usable GPU, driver or CUDA libraries)"
        )


def _matmul_graph(m: int, k: int, n: int, fp16: bool) -> bytes:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    dtype, elem = (np.float16, TensorProto.FLOAT16) if fp16 else (np.float32, TensorProto.FLOAT)
    weights = np.random.default_rng(0).standard_normal((k, n)).astype(dtype)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        "gemm",
        [helper.make_tensor_value_info("a", elem, [m, k])],
        [helper.make_tensor_value_info("y", elem, [m, n])],
        initializer=[numpy_helper.from_array(weights, "b")],
    )
    # IR version 10 (onnx 1.16): what every onnxruntime this package allows (>= 1.20) reads; newer onnx writes
    # a version that older onnxruntime-gpu builds refuse
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model.SerializeToString()


def _sustained_on_device(m: int, k: int, n: int, fp16: bool, seconds: float) -> float:
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(_matmul_graph(m, k, n, fp16), providers=[CUDA])
    a = np.random.default_rng(1).standard_normal((m, k)).astype(np.float16 if fp16 else np.float32)
    binding = session.io_binding()
    binding.bind_ortvalue_input("a", ort.OrtValue.ortvalue_from_numpy(a, "cuda", 0))
    binding.bind_output("y", "cuda")
    session.run_with_iobinding(binding)  # warm-up (cuBLAS picks its algorithm)
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or calls < 3:
        session.run_with_iobinding(binding)  # returns when the kernel is done
        calls += 1
    return 2.0 * m * k * n * calls / elapsed / 1e9


def measure_kernels(hidden: int, intermediate: int, seconds_per_shape: float) -> dict:
    """ONNX Runtime's CUDA MatMul, fp16 and fp32, on the encoder's shapes and one large square one."""
    shapes = [
        (rows, k, n)
        for rows in (2048, 16384)
        for k, n in ((hidden, intermediate), (intermediate, hidden), (hidden, hidden))
    ] + [(4096, 4096, 4096)]

    def measure(precision: str, m: int, k: int, n: int) -> float:
        return _sustained_on_device(m, k, n, precision == "fp16", seconds_per_shape)

    operators = {"fp16": "MatMul (cuBLAS, I/O bound on the device)", "fp32": "MatMul (cuBLAS)"}
    return {"provider": CUDA} | peaks_over_shapes(measure, operators, shapes)
