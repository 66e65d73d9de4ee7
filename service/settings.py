"""Every server setting in one place: defaults < `BERTSERVE_*` environment variables < command-line flags.

A bad value stops the server at start with the setting named (see `load_settings`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bertserve.repository import MODEL_SPEC, parse_model_spec

ENV_PREFIX = "BERTSERVE_"
STREAM_INPUTS_IN_FLIGHT = 128  # max_stream_inputs_in_flight's default
STREAM_BATCH_TOKENS = 128  # max_stream_batch_tokens' default
CONCURRENT_STREAMS = 8  # max_concurrent_streams' default
WORKERS_MAX = 64
AUTO_WORKERS_MAX = 8  # fronts `workers auto` starts at most
AUTO_TOKENIZE_THREADS = 8  # threads `tokenize_threads` 0 gives one call at most
CGROUP = Path("/sys/fs/cgroup")  # this process's cgroup (v2) inside a container


def _cpu_quota(cgroup: Path) -> float | None:
    """The cgroup's CPU quota in CPUs (cgroup v2 `cpu.max`, else v1 `cpu.cfs_quota_us`); None: no quota."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cpus(cgroup: Path = CGROUP) -> int:
    """CPUs this process may use: its affinity, capped by its cgroup's CPU quota (a container's CPU limit,
    rounded up)."""
    cpus = len(os.sched_getaffinity(0))
    quota = _cpu_quota(cgroup)
    return cpus if quota is None else max(1, min(cpus, math.ceil(quota)))


def auto_workers(cpus: int | None = None) -> int:
    """Fronts for `workers auto`: one per usable CPU but one (the engine's), none extra on 2 CPUs or fewer."""
    cpus = usable_cpus() if cpus is None else cpus
    return 1 if cpus <= 2 else min(cpus - 1, AUTO_WORKERS_MAX)


def front_count(workers: int | str) -> int:
    """The front processes a `workers` setting gives: auto resolved from the CPUs this process may use."""
    return auto_workers() if workers == "auto" else int(workers)


class SettingsError(ValueError):
    """One line per bad setting, each naming the setting and its environment variable."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    model_repo: Path = Path("model_repository")
    # NAME or NAME:VERSION, comma-separated in the environment; empty = every model, highest version.
    # The first model listed that has a task is the default model for that task's RPC.
    models: Annotated[list[str], NoDecode] = Field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535)  # 0 = pick a free port
    metrics_port: int = Field(8002, ge=-1, le=65535)  # 0 = pick a free port, -1 = no metrics endpoint
    precision: Literal["fp32", "int8", "fp16"] = "fp32"
    provider: Literal["auto", "cpu", "cuda"] = "auto"
    # How a thread waiting for the GPU waits (service/engine/cuda_sync.py): CUDA's own choice, or blocking
    # (sleeps: frees the core CUDA's spinning keeps busy for each batch), yield, spin.
    cuda_sync: Literal["auto", "blocking", "yield", "spin"] = "auto"
    # Each batch shape of an encoder on CUDA replayed as a CUDA graph, one launch instead of one per kernel
    # (service/engine/captured_runs.py; needs shape buckets and one instance): auto where the session can,
    # on (refuses to start where it cannot), off.
    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    intra_op_threads: int = Field(0, ge=0, le=256)  # 0 = ONNX Runtime's default (one per physical core)
    inter_op_threads: int = Field(1, ge=0, le=64)
    # Model instances per encoder (as Triton's instance groups): this many batches computed at the same
    # time, each with intra_op_threads threads. `instance_sessions` says whether they are concurrent runs
    # of ONE ONNX Runtime session (shared: the weights and their pre-packed copies held once; ORT's Run is
    # thread-safe) or a session each (separate: a copy of the weights per instance, +90-160 MB RSS per
    # fp32 MiniLM instance measured here). auto: shared on CPU, separate on CUDA (a session's runs share its
    # stream). Measured on 2 cores, in process, batches of one: 2 x 1 thread shared 197-205 inputs/s,
    # separate 174-188; 2 x 2 threads shared 167-183, one session 1 x 2 150-157.
    instances: int = Field(1, ge=1, le=64)
    instance_sessions: Literal["auto", "shared", "separate"] = "auto"
    max_batch_size: int = Field(32, ge=1, le=4096)
    # Padded length x inputs. ONNX Runtime's arena keeps the largest batch's activations, so this also
    # bounds that memory: MiniLM server RSS after the quick bench 457 MB at 16384, 365-378 MB at 2048. On
    # CPU, smaller batches are no slower (in process, length-sorted: 2048-token batches 102-105 inputs/s,
    # 16384-token ones 36: their activations leave the cache). Raise it on GPUs (the gpu overlay: 16384).
    max_batch_tokens: int = Field(2048, ge=2, le=4_194_304)
    # A batch stops growing before its padded tokens exceed this multiple of its real tokens. On CPU,
    # compute grows with padded tokens: with 16 callers of mixed lengths (MiniLM, 2 cores) 1.1 gave about
    # 3x the throughput of no limit, and 1.05 was as fast as 1.1 or faster (fp32 and int8, 16 and 64
    # callers; median of 6 interleaved passes: 1.3 was slowest) with padding 1.02-1.03 instead of
    # 1.05-1.08. Raise it on GPUs, where bigger batches matter more than padding.
    max_padding_ratio: float = Field(1.05, ge=1.0, le=1000)
    # "buckets": each batch padded up to one of a few shapes (service/engine/shapes.py), all run once
    # before the server reports serving, since a GPU's first run of a new shape is slow
    # (docs/performance/gpu-h200); "exact": as the batch comes. auto: buckets on CUDA, else exact.
    batch_shapes: Literal["auto", "exact", "buckets"] = "auto"
    # How the batcher picks a batch from the queue (both take the oldest input). padding: it and its
    # neighbours in length within max_padding_ratio. cost: the batch whose cost is least against its
    # inputs' cost in a full unpadded batch (a line fitted through the batches' times: fixed + per padded
    # token; service/engine/batch_policy.py), max_padding_ratio still a cap. auto: cost with shape
    # buckets, else padding (on CPU it gained nothing: docs/performance/batch-cut).
    batch_cut: Literal["auto", "cost", "padding"] = "auto"
    # How long the oldest queued input may wait for company while the model is idle. 0 (as in TEI): the
    # model never waits; inputs that arrive while it computes still share the next batch. Measured here,
    # 2 ms of waiting cost about 5 ms at p50 for a lone call and gave no throughput.
    max_queue_delay_ms: float = Field(0.0, ge=0, le=10_000)
    # Per encoder and per lane: unary calls' inputs and streams' inputs each (service/engine/batcher.py), so streams
    # that fill theirs never refuse unary calls.
    max_queue_inputs: int = Field(1024, ge=1, le=1_000_000)
    # gRPC calls in flight at once, streams included (grpc.health.v1 Check excepted); beyond it a call is
    # refused at once with RESOURCE_EXHAUSTED and counted (service/grpc/admission.py). 0 = twice
    # max_queue_inputs: a full queue of one-input calls and as many again being tokenized or answered.
    max_concurrent_rpcs: int = Field(0, ge=0, le=1_000_000)
    # Client-streaming gRPC calls (EmbedStream, reflection) open at once, also counted in
    # max_concurrent_rpcs; beyond it a stream is refused at once with RESOURCE_EXHAUSTED. Each holds up
    # to a window of inputs and their answers (max_stream_inputs_in_flight) and one request read ahead,
    # so this bounds streams' memory (service/grpc/stream_memory.py). The default is the number of streams
    # whose windows fill the stream queue (max_queue_inputs / max_stream_inputs_in_flight): more streams
    # would add waiting, not throughput.
    max_concurrent_streams: int = Field(CONCURRENT_STREAMS, ge=1, le=100_000)
    # Attention calls waiting per encoder (each runs alone, alternating with batches; beyond: RESOURCE_EXHAUSTED).
    max_queue_attention: int = Field(256, ge=1, le=100_000)
    max_inputs_per_request: int = Field(256, ge=1, le=100_000)
    # EmbedStream: inputs of one stream admitted and not yet answered and sent (service/grpc/streaming.py). The
    # server reads the stream's next request only when it fits, so a stream runs in constant memory. A
    # request larger than this runs alone; clients send requests of a quarter of it. Stream inputs are
    # batched after unary calls' (service/engine/batcher.py), so the window sets how well a stream's batches can
    # group lengths, not how long a unary caller waits.
    max_stream_inputs_in_flight: int = Field(STREAM_INPUTS_IN_FLIGHT, ge=1, le=100_000)
    # Padded tokens of a batch of stream inputs while unary calls are active (one seen in the last second):
    # a unary call waits behind at most one such batch. Without unary calls, streams use max_batch_tokens.
    max_stream_batch_tokens: int = Field(STREAM_BATCH_TOKENS, ge=2, le=4_194_304)
    max_input_chars: int = Field(20_000, ge=1, le=10_000_000)
    # Threads of a front that tokenize one large call's (or group's) texts at once, in slices of at least
    # 1,024 characters (service/core/token_slices.py). 0 = auto: the usable CPUs, at most
    # AUTO_TOKENIZE_THREADS; 1 = one thread a call.
    tokenize_threads: int = Field(0, ge=0, le=64)
    # Plain ASCII texts of a BERT WordPiece tokenizer, on the embed path (ids only), are tokenized by a small
    # C++ library built on first use (service/engine/native_wordpiece/; the same ids as the tokenizers
    # library, several times faster); without a C++ compiler, by the library, with a warning. false: always
    # the library.
    native_tokenizer: bool = True
    # Embed calls cut every input longer than max_length (at the side the call names), as if each set
    # truncate, instead of refusing it (TEI's --auto-truncate).
    auto_truncate: bool = False
    max_masks_per_input: int = Field(32, ge=1, le=1024)
    max_message_bytes: int = Field(8 * 1024 * 1024, ge=1024, le=1 << 30)
    # Bytes of gRPC request messages held by unary calls in flight (streams: max_concurrent_streams and their
    # window; HTTP bodies: http_max_body_bytes_in_flight). A call past it gets RESOURCE_EXHAUSTED at once;
    # a lone call is always admitted. Bounds what max_concurrent_rpcs x max_message_bytes would allow.
    max_request_bytes_in_flight: int = Field(64 * 1024 * 1024, ge=1024, le=1 << 40)
    grace_period_s: float = Field(30.0, ge=0, le=3600)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # set: clients must present a certificate signed by it (mutual TLS)
    # HTTP beside gRPC (service/http/: OpenAI-compatible, bertserve JSON and KServe v2 REST routes).
    http_port: int = Field(8080, ge=-1, le=65535)  # 0 = pick a free port, -1 = no HTTP
    # every method through gRPC's C++ server (service/grpc/native/): unary calls there, streams relayed
    native_port: int = Field(-1, ge=-1, le=65535)  # 0 = pick a free port, -1 = off
    # What serves `port`: "python" (grpc.aio) or "native" (what serves native_port, which is then off).
    grpc_transport: Literal["python", "native"] = "python"
    http_max_connections: int = Field(1024, ge=1, le=1_000_000)  # beyond: 503 and closed
    # bytes of HTTP request bodies being read or answered, all connections together; beyond: 503
    http_max_body_bytes_in_flight: int = Field(64 * 1024 * 1024, ge=1024, le=1 << 40)
    # bytes of HTTP replies their clients have not taken yet, all connections together; beyond: the connection
    # waiting longest for its client is closed
    http_max_reply_bytes_in_flight: int = Field(64 * 1024 * 1024, ge=1024, le=1 << 40)
    http_read_timeout_s: float = Field(30.0, gt=0, le=3600)  # request headers, then its body, each within
    http_keep_alive_s: float = Field(30.0, gt=0, le=3600)  # an idle keep-alive connection is closed after
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # Front processes (gRPC and HTTP, validation, tokenization) sharing the ports and feeding one engine
    # process that owns the sessions and the batchers (service/supervisor/). 1: one process does it all.
    # auto: 1 where at most 2 CPUs are usable, else one per usable CPU but one, at most AUTO_WORKERS_MAX.
    workers: int | Literal["auto"] = Field("auto", union_mode="left_to_right")
    # Engine processes (with workers > 1): each owns its own sessions and batchers and serves the fronts
    # i % engines == its index, so the engines' event loops and GILs add up where one engine's loop limits
    # the device (docs/architecture.md, Processes). Each holds the models (and its GPU memory) once more.
    engines: int = Field(1, ge=1, le=WORKERS_MAX)
    # Above 0: a simulated device (service/engine/simulated_device.py). Encoder graphs are loaded but never run;
    # each batch is answered with correctly shaped constant outputs after this many milliseconds of sleep
    # (no CPU), and models report provider "simulated". For measuring the server's capacity beside a
    # device (`bertserve bench`'s simulated-device target), never for serving. 0 = off.
    simulated_device_ms: float = Field(0.0, ge=0, le=10_000)
    # With simulated_device_ms: microseconds more per padded token of a batch (a GPU's batch time grows
    # with its padded shape; docs/performance/batch-cut reads both terms off the H200's batches).
    simulated_device_us_per_token: float = Field(0.0, ge=0, le=10_000)

    @field_validator("models", mode="before")
    @classmethod
    def _split_models(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("models")
    @classmethod
    def _check_models(cls, value: list[str]) -> list[str]:
        for spec in value:
            if not MODEL_SPEC.match(spec):
                raise ValueError(f"{spec!r} is not NAME or NAME:VERSION")
        names = [spec.split(":")[0] for spec in value]
        if len(set(names)) != len(names):
            raise ValueError("a model is listed twice")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_tls(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key")
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: no such file: {path}")
        return self

    @model_validator(mode="after")
    def _check_http_budgets(self) -> Settings:
        """A body budget below one message would answer bodies between the two sizes 503 forever, a reply
        budget below one would close every connection a reply of that size waits on."""
        for name in ("http_max_body_bytes_in_flight", "http_max_reply_bytes_in_flight"):
            if getattr(self, name) < self.max_message_bytes:
                raise ValueError(
                    f"{name} {getattr(self, name)} must be at least max_message_bytes {self.max_message_bytes}"
                )
        return self

    @model_validator(mode="after")
    def _check_native(self) -> Settings:
        if self.grpc_transport == "native" and self.native_port >= 0:
            raise ValueError(
                "native_port: with grpc_transport native the main port is native; leave native_port off"
            )
        return self

    @model_validator(mode="after")
    def _resolve_concurrent_rpcs(self) -> Settings:
        """0 becomes twice max_queue_inputs, so every reader (Info, bertserve_limit) sees the bound in force."""
        if self.max_concurrent_rpcs == 0:
            self.max_concurrent_rpcs = 2 * self.max_queue_inputs
        return self

    @field_validator("engines")
    @classmethod
    def _check_engines(cls, value: int, info: ValidationInfo) -> int:
        """Every engine needs a front of its own to feed it (`workers` is validated first)."""
        workers = info.data.get("workers", 1)
        fronts = front_count(workers)
        if value > 1 and value > fronts:
            plural = "s" if fronts != 1 else ""
            raise ValueError(
                f"must be at most the front processes: workers is {workers} ({fronts} front{plural})"
            )
        return value

    @field_validator("workers", mode="before")
    @classmethod
    def _check_workers(cls, value: object) -> object:
        text = str(value).strip().lower()
        if text == "auto":
            return "auto"
        if not text.isdigit() or not 1 <= int(text) <= WORKERS_MAX:
            raise ValueError(f"must be auto or a number of processes from 1 to {WORKERS_MAX}")
        return int(text)

    def tokenize_thread_count(self) -> int:
        """`tokenize_threads` with 0 resolved from the CPUs this process may use."""
        return self.tokenize_threads or min(usable_cpus(), AUTO_TOKENIZE_THREADS)

    def worker_count(self) -> int:
        """`workers` with auto resolved from the CPUs this process may use."""
        return front_count(self.workers)

    def concurrent_rpcs_limit(self) -> int:
        """`max_concurrent_rpcs` (0 was resolved to twice max_queue_inputs)."""
        return self.max_concurrent_rpcs

    def model_specs(self) -> list[tuple[str, int | None]]:
        """`models` parsed into (name, version or None for the highest)."""
        return [parse_model_spec(spec) for spec in self.models]


def _describe(error: dict) -> str:
    field = ".".join(str(part) for part in error["loc"]) if error["loc"] else ""
    where = f"setting {field} ({ENV_PREFIX}{field.split('.')[0].upper()})" if field else "settings"
    value = error.get("input")
    shown = f" (got {value!r})" if field and not isinstance(value, dict) else ""
    return f"{where}: {error['msg']}{shown}"


def shares_session(instance_sessions: str, device: str) -> bool:
    """Whether an encoder's instances are concurrent runs of one session: `instance_sessions` shared, or
    auto on the CPU (on CUDA, auto gives each instance a session of its own)."""
    return instance_sessions == "shared" or (instance_sessions == "auto" and device == "cpu")


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with `overrides` (command-line flags that were given) on top."""
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        raise SettingsError("\n".join(_describe(e) for e in exc.errors())) from None
