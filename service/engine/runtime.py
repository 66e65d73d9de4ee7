"""ONNX Runtime sessions: execution provider chosen from config and reported as the session really got it.

onnxruntime-gpu lists CUDAExecutionProvider as available even on machines without a GPU, so the only
truth is `session.get_providers()` after the session exists. `provider=cuda` insists (startup error
otherwise); `auto` takes CUDA when the session really gets it, else CPU.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bertserve.service.engine.captured_runs import CapturedRuns, run_options
from bertserve.service.errors import StartupError
from bertserve.service.thread_names import thread_named

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

# The attention kernels ONNX Runtime's CUDA provider may pick (its `sdpa_kernel` bit mask, AttentionBackend
# in attention_common.h): every one but cuDNN's flash attention (8). onnxruntime-gpu 1.31 picks cuDNN's
# for the fp16 graph by default, and cuDNN builds a graph for every new (batch, length) shape: measured on
# an H100, MiniLM fp16, 60 random shapes, median 79 ms for a shape's first run against 1 ms again. A
# server sees new shapes all the time (server-fp16 at c=16: 46 inputs/s with it, 457 without).
SDPA_KERNELS = 1 | 2 | 4 | 16 | 32 | 64  # flash, memory-efficient, TensorRT fused, unfused, TRT flash, cross
CUDA_OPTIONS = {"sdpa_kernel": str(SDPA_KERNELS)}


# A run of a session made with CUDA graphs that is not one of its captured runs: without this graph id,
# ONNX Runtime would capture it as graph 0 and replay that graph, on that run's buffers, ever after.
NOT_CAPTURED = "-1"


def providers_for(provider: str, cuda_graphs: bool = False) -> list:
    """The providers a session asks for under the `provider` setting: CUDA (with CUDA_OPTIONS, and CUDA
    graphs if asked) then CPU for auto or cuda where this onnxruntime has CUDA, else CPU alone."""
    if provider in ("auto", "cuda") and CUDA in ort.get_available_providers():
        options = {**CUDA_OPTIONS, "enable_cuda_graph": "1"} if cuda_graphs else CUDA_OPTIONS
        return [(CUDA, options), CPU]
    return [CPU]


def session_options(intra_op_threads: int, inter_op_threads: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads  # 0 = ORT's default
    options.inter_op_num_threads = inter_op_threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # ORT's worker threads otherwise spin between runs, taking the cores that the event loop, gRPC and
    # tokenization need: measured here (2 cores, 16 callers, MiniLM) +40-65% throughput without spinning.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # The CPU arena keeps the largest batch's activations for the life of the process (MiniLM after
    # batches of up to 32 x 256 tokens: 563 MB RSS with it, 296 MB without). Without it every run takes
    # its buffers from malloc, and the server fixes glibc's mmap threshold at 128 KiB (service/memory.py),
    # so each buffer is a fresh mapping whose pages fault in on every run: in-process, MiniLM, mixed
    # corpus, batch 8, interleaved runs: 70-71 inputs/s without the arena, 111-117 with it (95-101
    # without both the arena and the fixed threshold). max_batch_tokens bounds what the arena keeps.
    options.enable_cpu_mem_arena = True
    options.log_severity_level = 3  # errors only; the server logs what matters itself
    return options


class GraphSession:
    """One ONNX graph. `run` is blocking (ORT releases the GIL): call it from a worker thread."""

    def __init__(
        self,
        path: Path,
        provider: str,
        intra_op_threads: int,
        inter_op_threads: int,
        io_binding: bool | None = None,
        initializers: dict[str, np.ndarray] | None = None,
        cuda_graphs: str = "off",
    ):
        """`initializers`: name -> array that replaces the graph's initializer of that name (same dtype and
        shape); on CPU the session uses the array's memory instead of a copy of its own (a table shared by
        several sessions is held once). `cuda_graphs` (the setting: auto, on, off): runs asked for as
        `captured` are CUDA graphs (service/engine/captured_runs.py); auto falls back to plain runs where
        the session cannot have them, on refuses to start."""
        options = session_options(intra_op_threads, inter_op_threads)
        # The OrtValues must outlive the session, which reads their memory.
        self._initializers = {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in (initializers or {}).items()}
        for name, value in self._initializers.items():
            options.add_initializer(name, value)
        graphs = cuda_graphs != "off" and providers_for(provider)[0] != CPU
        try:
            self.session = self._open(path, options, providers_for(provider, graphs))
        except StartupError as exc:
            if not graphs or cuda_graphs == "on":
                raise
            log.warning("%s: no CUDA graphs, plain runs instead (%s)", path, exc)
            graphs = False
            self.session = self._open(path, options, providers_for(provider))
        self.providers = self.session.get_providers()
        self.provider = CUDA if CUDA in self.providers else CPU
        if provider == "cuda" and self.provider != CUDA:
            raise StartupError(
                f"{path}: provider cuda was asked for, but the session got {self.providers} "
                "(no usable GPU or CUDA libraries); use provider auto or cpu"
            )
        if cuda_graphs == "on" and self.provider != CUDA:
            raise StartupError(
                f"{path}: cuda_graphs on needs a CUDA session, but the session got {self.providers}; "
                "use cuda_graphs auto or off"
            )
        self.device = "cuda" if self.provider == CUDA else "cpu"
        graphs = graphs and self.provider == CUDA
        self.graphs_required = cuda_graphs == "on"  # the warm-up fails the start where nothing was captured
        self._plain_options = run_options(NOT_CAPTURED if graphs else None)
        self.captured: CapturedRuns | None = CapturedRuns(self.session, self.device, True) if graphs else None
        # I/O binding keeps outputs on the device until copied once; on CPU it works the same way.
        self.io_binding = self.provider == CUDA if io_binding is None else io_binding
        self._constants: dict[str, np.ndarray] = {}  # see set_constant_inputs
        self._bound_constants: dict[str, ort.OrtValue | None] = {}
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._where = "/".join(Path(path).parts[-3:])  # NAME/VERSION/file.onnx
        log.info(
            "%s: session on %s (provider setting %s, io_binding %s, cuda graphs %s)",
            self._where,
            self.providers,
            provider,
            self.io_binding,
            "on" if graphs else "off",
        )

    @staticmethod
    def _open(path: Path, options: ort.SessionOptions, providers: list) -> ort.InferenceSession:
        try:
            with thread_named("bs-onnxruntime"):  # the session's own threads, started now, inherit it
                return ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:  # ORT raises several unrelated types for unreadable graphs
            raise StartupError(f"{path}: ONNX Runtime cannot load it: {exc}") from None

    def stop_capturing(self, reason: str) -> None:
        """Plain runs from now on (a captured run failed)."""
        if self.captured is not None:
            log.warning("%s: no more captured runs: %s", self._where, reason)
            self.captured = None

    def set_constant_inputs(self, feeds: dict[str, np.ndarray]) -> None:
        """Inputs given to every run (a tied decoder's table): with I/O binding on CUDA, copied to the device
        once; on CPU the array itself is fed (ORT reads a CPU numpy input in place)."""
        self._constants = dict(feeds)
        on_device = self.io_binding and self.device == "cuda"
        self._bound_constants = {
            name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a), "cuda", 0) if on_device else None
            for name, a in feeds.items()
        }

    def run(
        self, feeds: dict[str, np.ndarray], outputs: list[str], captured: bool = False
    ) -> dict[str, np.ndarray]:
        """`captured`: a run of one of a few shapes (a bucket), replayed as a CUDA graph where the session
        has one for it; a captured run that fails stops capturing and runs plain."""
        constants = self._constants
        if captured and self.captured is not None and not constants:
            try:
                if (answers := self.captured.run(feeds, outputs)) is not None:
                    return answers
            except Exception as exc:  # noqa: BLE001  (ORT's error types vary; the plain run says if it persists)
                self.stop_capturing(f"a captured run failed: {exc}")
        if not self.io_binding:
            answers = self.session.run(outputs, {**feeds, **constants}, self._plain_options)
            return dict(zip(outputs, answers, strict=True))
        binding = self.session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name, array in constants.items():
            if (value := self._bound_constants[name]) is not None:
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, array)
        for name in outputs:
            binding.bind_output(name, self.device)
        self.session.run_with_iobinding(binding, self._plain_options)
        return dict(zip(outputs, binding.copy_outputs_to_cpu(), strict=True))


class EngineSession:
    """A graph that another process runs (the engine, with `workers` > 1): a front holds its model's
    manifest and tokenizer but no ONNX Runtime session. `provider` and `device` are the engine's, set when
    the front connects to it."""

    def __init__(self, path: Path | str):
        self.path = str(path)
        self.provider = "engine"
        self.providers = [self.provider]
        self.device = "engine"

    def set_constant_inputs(self, feeds: dict[str, np.ndarray]) -> None:
        """Nothing to hold: the engine feeds its own."""

    def run(
        self, feeds: dict[str, np.ndarray], outputs: list[str], captured: bool = False
    ) -> dict[str, np.ndarray]:
        raise RuntimeError(f"{self.path}: this process does not run graphs (the engine process does)")
