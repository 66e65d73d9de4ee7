"""Servers under test as child processes on 127.0.0.1: start, wait until ready, measure, stop.

Readiness is awaited, never polled: for bertserve, the grpc.health.v1 Watch stream reporting SERVING;
for the naive server (which has no health service), the gRPC channel becoming ready. Either way the
wait races the child's exit, so a server that dies at start fails the bench at once with its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertserve.bench import process_tree

# gRPC's reconnect backoff (1 s, then x1.6) would round a start-up time up to the next retry of a
# client that tried before the server listened; the readiness channel retries every 20-50 ms instead.
READINESS_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 20),
    ("grpc.min_reconnect_backoff_ms", 20),
    ("grpc.max_reconnect_backoff_ms", 50),
]


class BenchError(RuntimeError):
    """A one-line reason the bench cannot go on (printed by the command, exit 1)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_pythonpath() -> dict[str, str]:
    """PYTHONPATH that lets child processes import bench and bertserve from a source checkout too."""
    root = str(Path(__file__).resolve().parents[1])
    return {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}


@dataclass
class ServerProcess:
    name: str
    argv: list[str]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment
    metrics_port: int | None = None
    http_port: int | None = None  # bertserve's HTTP front
    embed_port: int | None = None  # where Embed load goes when not `port` (bertserve's native port)
    protocol: str = "grpc"  # how the load generator calls it: "grpc" (Embed) or "http" (/bertserve/v1/embed)
    health_checked: bool = True  # bertserve: wait for SERVING; naive: wait for the channel
    cpus: list[int] | None = None  # the CPUs it may run on (sched_setaffinity); None: this process's
    process: asyncio.subprocess.Process | None = None
    startup_s: float | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def embed_address(self) -> str:
        return f"127.0.0.1:{self.embed_port or self.port}"

    @property
    def metrics_url(self) -> str | None:
        return f"http://127.0.0.1:{self.metrics_port}/metrics" if self.metrics_port else None

    async def start(self, timeout_s: float) -> float:
        """Spawns the server and returns the seconds until it was ready."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 (the child keeps writing after this returns)
        started = time.perf_counter()
        self.process = await asyncio.create_subprocess_exec(
            *self._pinned_argv(), stdout=log, stderr=asyncio.subprocess.STDOUT, env={**os.environ, **self.env}
        )
        log.close()
        ready = asyncio.ensure_future(self._ready())
        exited = asyncio.ensure_future(self.process.wait())
        done, _ = await asyncio.wait({ready, exited}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for task in (ready, exited):
            if task not in done:
                task.cancel()
        if ready in done and ready.exception() is None:
            self.startup_s = time.perf_counter() - started
            return self.startup_s
        if exited in done:
            reason = f"exited with {self.process.returncode}"
        elif ready in done:
            reason = f"failed its readiness check: {ready.exception()}"
        else:
            reason = f"not ready in {timeout_s:.0f} s"
        await self.stop()
        raise BenchError(f"{self.name} {reason}; its log ({self.log_path}) ends:\n{self.log_tail()}")

    def _pinned_argv(self) -> list[str]:
        """argv, started through a Python that pins itself to `cpus` and execs it (no fork in this process,
        whose gRPC threads would make it warn)."""
        if not self.cpus:
            return self.argv
        pin = f"import os, sys; os.sched_setaffinity(0, {sorted(self.cpus)}); os.execv(sys.argv[1], sys.argv[1:])"
        return [sys.executable, "-c", pin, *self.argv]

    async def _ready(self) -> None:
        async with grpc.aio.insecure_channel(self.address, options=READINESS_CHANNEL_OPTIONS) as channel:
            if not self.health_checked:
                await channel.channel_ready()
                return
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), wait_for_ready=True
            )
            async for reply in watch:
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    watch.cancel()
                    return
            raise BenchError(f"{self.name}: the health stream ended before SERVING")

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the server's whole process tree so far (a server of several processes
        spends it in all of them; bench/process_tree.py)."""
        if self.process is None or self.process.returncode is not None:
            return None
        return process_tree.tree_cpu_seconds(self.process.pid)

    def thread_cpu_seconds(self) -> dict:
        """Each thread's CPU so far, over the whole process tree (bench/process_tree.py); {} when stopped."""
        if self.process is None or self.process.returncode is not None:
            return {}
        return process_tree.thread_cpu_seconds(self.process.pid)

    def pids(self) -> list[int]:
        """The server's process and its descendants now; [] when stopped."""
        if self.process is None or self.process.returncode is not None:
            return []
        return process_tree.tree(self.process.pid)

    def processes(self) -> int | None:
        """How many processes the server runs now (itself and its descendants)."""
        return len(self.pids()) or None

    def loop_cpu_seconds(self) -> float | None:
        """User + system CPU time of the server's main thread (its event loop: gRPC's per-call work,
        admission, replies) so far; None for a server that is not running or not reachable."""
        if self.process is None or self.process.returncode is not None:
            return None
        pid = self.process.pid
        main = [t for t in psutil.Process(pid).threads() if t.id == pid]
        return main[0].user_time + main[0].system_time if main else None

    def rss_mb(self) -> float | None:
        if self.process is None or self.process.returncode is not None:
            return None
        return psutil.Process(self.process.pid).memory_info().rss / 2**20

    async def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace_s`; returns the exit code."""
        if self.process is None or self.process.returncode is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), grace_s)
        except asyncio.TimeoutError:
            self.process.kill()
            return await self.process.wait()

    def log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"


def bertserve_process(
    name: str,
    repo: Path,
    model: str,
    threads: int,
    log_dir: Path,
    settings: dict[str, str],
    protocol: str = "grpc",
) -> ServerProcess:
    """`bertserve serve` configured through its BERTSERVE_* settings; `settings` override the defaults here."""
    port, metrics_port, http_port = free_port(), free_port(), free_port()
    env = {
        "BERTSERVE_MODEL_REPO": str(repo),
        "BERTSERVE_MODELS": model,
        "BERTSERVE_HOST": "127.0.0.1",
        "BERTSERVE_PORT": str(port),
        "BERTSERVE_METRICS_PORT": str(metrics_port),
        "BERTSERVE_HTTP_PORT": str(http_port),
        "BERTSERVE_INTRA_OP_THREADS": str(threads),
        "BERTSERVE_INTER_OP_THREADS": "1",
        "BERTSERVE_LOG_LEVEL": "WARNING",
    } | {f"BERTSERVE_{key.upper()}": value for key, value in settings.items()}
    argv = [sys.executable, "-m", "bertserve.cli", "serve"]
    return ServerProcess(
        name,
        argv,
        port,
        log_dir / f"{name}.log",
        env,
        metrics_port=metrics_port,
        http_port=http_port,
        protocol=protocol,
    )


def naive_process(
    checkpoint: Path, threads: int, pooling: str, normalize: bool, max_length: int, log_dir: Path
) -> ServerProcess:
    port = free_port()
    argv = [
        sys.executable, "-m", "bertserve.bench.naive_server", "--checkpoint", str(checkpoint), "--port", str(port),
        "--threads", str(threads), "--pooling", pooling, "--max-length", str(max_length),
        "--normalize" if normalize else "--no-normalize",
    ]  # fmt: skip
    env = {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    return ServerProcess("naive-fp32", argv, port, log_dir / "naive-fp32.log", env, health_checked=False)
