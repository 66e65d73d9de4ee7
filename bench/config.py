"""What one `bertserve bench` run measures: the model, targets, corpus sizes, phases and load generator."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bertserve.bench import analysis
from bertserve.service.settings import shares_session


@dataclass(frozen=True)
class BenchConfig:
    model_repo: Path
    out: Path
    model: str | None = None
    checkpoint: Path | None = None
    threads: int = 2
    quick: bool = False
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    texts: int = 1000  # mixed-corpus texts per phase (the corpus holds 2000)
    fixed_texts: int = 128
    fixed_length: int = 128  # tokens, [CLS] and [SEP] included; capped at the model's max_length
    inputs_per_request: int = 1
    ceiling_batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 8, 16, 32])
    ceiling_passes: int = 2
    ceiling_min_s: float = 0.0  # each ceiling batch size passes at least this long (on a GPU: a pass is ms)
    single_latency_texts: int = 400  # in-process one-at-a-time latency over this many texts
    gemm_seconds_per_shape: float = 0.3
    open_rate: float | None = None  # requests/s; None: a fraction of server-fp32's saturation rate
    open_rate_fraction: float = 0.7
    stream: bool = True  # server-fp32 also runs the EmbedStream phases (bench/streaming.py)
    # phases long enough for a fast server: a closed one sends at least this many requests per caller, an
    # open one lasts at least min_open_s (the corpus over again; 0: the corpus once, the CPU rounds' protocol)
    min_requests_per_caller: int = 0
    min_open_s: float = 0.0
    loadgen_threads: int = 1  # threads of the native gRPC load generator's closed phases
    phase_time_limit_s: float | None = 90.0  # a phase sends no request after this (slow targets stay bounded)
    server_settings: dict[str, str] = field(
        default_factory=dict
    )  # extra BERTSERVE_* for every bertserve target
    targets: list[str] = field(
        default_factory=lambda: [
            analysis.SERVER,
            analysis.SERVER_BS1,
            analysis.SERVER_INT8,
            analysis.NAIVE,
            analysis.SIMULATED_DEVICE,
        ]
    )
    simulated_device_ms: float = 1.0  # the simulated device's time per batch (the H100's MiniLM batch)
    simulated_device_calls: int = 6000  # single-input calls per workers value (phase_time_limit_s bounds it)
    # cuda: ceilings, kernels and servers on ONNX Runtime's CUDA provider (bench/gpu.py)
    provider: str = "cpu"
    # what sends the gRPC targets' requests: "native" (bench/native_loadgen.py, the Python client when it
    # cannot be built here) or "python" (bench/loadgen.py, in this process)
    loadgen: str = "native"
    # gRPC connections of the sweep's callers: "one" shared by all (the CPU rounds' protocol) or
    # "per-caller", as independent clients (a server with several front processes gets each connection in
    # one of them); the simulated-device target always uses per-caller
    connections: str = "one"
    # where the gRPC bertserve targets' Embed calls go: "main" (the gRPC port) or "native" (the native port:
    # Embed calls through gRPC's C++ server, service/grpc/native/; in every front)
    front: str = "main"

    @property
    def measured_targets(self) -> list[str]:
        """On CUDA the low-precision target is fp16 (int8 is a CPU graph) and the naive PyTorch server, a
        CPU baseline, is left out."""
        if self.provider != "cuda":
            return self.targets
        swap = {analysis.SERVER_INT8: analysis.SERVER_FP16, analysis.NAIVE: None}
        return [t for t in (swap.get(t, t) for t in self.targets) if t is not None]

    @property
    def ceiling_layouts(self) -> list[tuple[int, int, bool]]:
        """(instances, threads per instance, one shared session) the ceiling tries: one session with every
        thread, and the bertserve targets' own layout when they run several instances (`--server-setting
        instances=N`, with intra_op_threads, which the bench sets to --threads, and instance_sessions)."""
        settings = self.server_settings
        instances = int(settings.get("instances", 1))
        layouts = [(1, self.threads, False)]
        if instances > 1:
            per_instance = int(settings.get("intra_op_threads", self.threads)) or self.threads
            shared = shares_session(settings.get("instance_sessions", "auto"), self.provider)
            layouts.append((instances, per_instance, shared))
        return layouts

    @classmethod
    def quick_preset(cls, **overrides) -> BenchConfig:
        preset = dict(
            quick=True,
            texts=160,
            fixed_texts=32,
            ceiling_batch_sizes=[1, 8],
            ceiling_passes=2,
            gemm_seconds_per_shape=0.1,
            phase_time_limit_s=8.0,
            simulated_device_calls=3000,
        )
        return cls(**(preset | overrides))
