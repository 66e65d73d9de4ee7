"""The simulated-device target: what the server's fronts can feed a device, measured on any machine.

bertserve with `simulated_device_ms` (service/engine/simulated_device.py: each encoder batch answered after a sleep
that costs no CPU, as a GPU's batch) takes single-input Embed callers (PER_CALL_CONCURRENCY of them, the
single-input phase of server-fp32), each caller on a connection of its own (a server's fronts share one port
and each connection lands in one of them), from one server per workers value (`workers`,
BERTSERVE_WORKERS), all started first and measured in interleaved rounds. A value the server
refuses (it exits at start, or runs fewer processes than the fronts asked for: a server that does not know
the setting) is skipped with a note. Its CPU is the whole process tree's (bench/process_tree.py), so
`cpu_ms_per_call` covers every front, the engine and the supervisor.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable
from pathlib import Path

from bertserve.bench import gpu
from bertserve.bench.loadgen import Request
from bertserve.bench.processes import (
    BenchError,
    ServerProcess,
    bertserve_process,
    child_pythonpath,
    free_port,
)
from bertserve.bench.targets import PER_CALL_CONCURRENCY, TargetRun

WORKERS = ("1", "2", "auto", "native", "native-2", "http")  # `workers` values, in measuring order
# "native" and "native-N": workers 1 (or N), the load on the native port (Embed calls through gRPC's
# C++ server, in every front); "http": workers 1, the load POSTed to /bertserve/v1/embed
NATIVE, NATIVE_TWO, HTTP = "native", "native-2", "http"
ROUNDS = 3  # phases per server, interleaved with the other servers' phases
STARTUP_TIMEOUT_S = 180.0


def _calls(single: list[Request], calls: int) -> list[Request]:
    """The single-input requests repeated up to `calls` (a phase long enough for the CPU's clock ticks)."""
    return [single[i % len(single)] for i in range(max(calls, len(single)))]


def _row(workers: str, processes: int, startup_s: float, exit_code: int | None, phases: list[dict]) -> dict:
    """One server's figures over its rounds: rates and CPU pooled over every round, latencies the median of
    the rounds' (each round's phase is kept under "rounds")."""
    seconds = sum(p["seconds"] for p in phases)
    inputs = sum(p["inputs"] for p in phases)
    servers = [p.get("server") or {} for p in phases]

    def pooled(key: str) -> float | None:  # a per-second figure over all rounds
        values = [p.get(key) for p in phases]
        return (
            None
            if None in values
            else sum(v * p["seconds"] for v, p in zip(values, phases, strict=True)) / seconds
        )

    def median(values: list) -> float | None:
        return None if not values or None in values else statistics.median(values)

    cores = pooled("server_cpu_cores")
    return {
        "workers": workers,
        "processes": processes,  # the server's process tree once ready
        "startup_s": startup_s,
        "exit_code": exit_code,
        "inputs_per_s": inputs / seconds,
        "requests_per_s": sum(p["requests_ok"] for p in phases) / seconds,
        "p50_ms": median([p["p50_ms"] for p in phases]),
        "p99_ms": median([p["p99_ms"] for p in phases]),
        "server_cpu_cores": cores,
        "client_cpu_cores": pooled("client_cpu_cores"),
        # CPU of every process of the server per single-input call (an input each)
        "cpu_ms_per_call": 1e3 * cores * seconds / inputs if cores is not None and inputs else None,
        "batch_size_mean": median([s.get("batch_size_mean") for s in servers]),
        "device_busy_fraction": median([s.get("inference_busy_fraction") for s in servers]),
        "calls": sum(p["requests_ok"] for p in phases),
        "errors": dict(sum((collections.Counter(p["errors"]) for p in phases), collections.Counter())),
        "stopped_early": any(p["stopped_early"] for p in phases),
        "rounds": phases,
    }


async def _start(
    workers: str, settings: dict[str, str], repo: Path, spec: str, threads: int, logs: Path,
    log: Callable[[str], None],
) -> tuple[ServerProcess | None, dict]:  # fmt: skip
    """The server with `workers`, started: (it, its row so far), or (None, {"skipped": why}) when it refused
    the value."""
    name = f"simulated-device-w{workers}"
    chosen = {"workers": "1" if workers == HTTP else workers}
    if workers.startswith(NATIVE):
        native_port = free_port()
        chosen = {"workers": workers.partition("-")[2] or "1", "native_port": str(native_port)}
    protocol = "http" if workers == HTTP else "grpc"
    server = bertserve_process(name, repo, spec, threads, logs, settings | chosen, protocol)
    if workers.startswith(NATIVE):
        server.embed_port = native_port
    server.env.update(child_pythonpath())
    try:
        startup_s = await server.start(STARTUP_TIMEOUT_S)
    except BenchError as error:  # its first line, and its log's last (the server's reason)
        lines = str(error).splitlines()
        why = lines[0] if len(lines) < 2 else f"{lines[0]} {lines[-1].strip()}"
        return None, {"workers": workers, "skipped": f"the server refused workers={workers}: {why}"}
    processes = server.processes() or 0
    fronts = chosen["workers"]
    if fronts.isdigit() and int(fronts) > 1 and processes <= int(fronts):
        await server.stop()
        return None, {
            "workers": workers,
            "skipped": f"workers={workers} ran {processes} process(es), not a supervisor, an engine and "
            f"{workers} fronts: this server does not take BERTSERVE_WORKERS",
        }
    log(f"  {name} ready in {startup_s:.1f} s, {processes} process(es)")
    return server, {"workers": workers, "processes": processes, "startup_s": startup_s}


async def measure(
    repo: Path, spec: str, model: str, single: list[Request], settings: dict[str, str], device_ms: float,
    calls: int, threads: int, logs: Path, time_limit_s: float | None, log: Callable[[str], None],
    native: Path | None, notes: list[str], workers_values: tuple[str, ...] = WORKERS,
) -> dict:  # fmt: skip
    """Every workers value's server, started together, then ROUNDS rounds of one phase per server in turn
    (`calls` per server in all), so a machine whose speed drifts slows each alike; a skipped value adds its
    reason to `notes`. `settings`: the bertserve targets' own; the device's sessions are loaded on the CPU
    and never run. The servers take a GPU's batch settings (bench/gpu.py: padding is cheap on the device it
    stands for, launches dear) unless `settings` name them."""
    settings = gpu.SERVER_SETTINGS | settings | {"provider": "cpu", "simulated_device_ms": f"{device_ms:g}"}
    requests = _calls(single, calls // ROUNDS)
    rows, servers = {}, {}
    try:
        for workers in workers_values:
            server, rows[workers] = await _start(workers, settings, repo, spec, threads, logs, log)
            if server is None:
                notes.append(f"simulated-device: {rows[workers]['skipped']}")
                log(f"  {notes[-1]}")
            else:
                servers[workers] = server
        phases: dict[str, list[dict]] = {workers: [] for workers in servers}
        for _ in range(ROUNDS):
            for workers, server in servers.items():
                run = TargetRun(server, model, None, log, native, per_caller=True)  # a front per connection
                async with run.connected(PER_CALL_CONCURRENCY):
                    plan = [("single", requests, PER_CALL_CONCURRENCY)]
                    phases[workers].append((await run.closed_phases(plan, time_limit_s))["single"])
    finally:
        exit_codes = {workers: await server.stop() for workers, server in servers.items()}
    for workers in servers:
        row = rows[workers]
        rows[workers] = _row(
            workers, row["processes"], row["startup_s"], exit_codes[workers], phases[workers]
        )
    return summarize(rows, device_ms)


def _rate(row: dict | None) -> float | None:
    return None if row is None or "skipped" in row else row["inputs_per_s"]


def summarize(rows: dict[str, dict], device_ms: float) -> dict:
    """bench.json's `simulated_device`, with `front_cpu_ms_per_call`: the CPU per call of the measured run
    with the most processes (where the split between processes costs most; the first such run in order)."""
    measured = [row for row in rows.values() if "skipped" not in row]
    widest = max(
        (row for row in measured if row["workers"] in ("1", "2", "auto")),
        key=lambda row: row["processes"],
        default=None,
    )
    one, two, native = _rate(rows.get("1")), _rate(rows.get("2")), _rate(rows.get(NATIVE))
    native_two, http = _rate(rows.get(NATIVE_TWO)), _rate(rows.get(HTTP))

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def cpu(workers: str) -> float | None:
        return None if _rate(rows.get(workers)) is None else rows[workers]["cpu_ms_per_call"]

    return {
        "device_ms_per_batch": device_ms,
        "concurrency": PER_CALL_CONCURRENCY,
        "workers": rows,
        "two_vs_one_worker": ratio(two, one),
        "front_cpu_ms_per_call": widest and widest["cpu_ms_per_call"],
        "front_cpu_workers": widest and widest["workers"],
        # the native port: Embed calls through gRPC's C++ server, in one process, then in 2 fronts
        "native_vs_one_worker": ratio(native, one),
        "native_cpu_ms_per_call": cpu(NATIVE),
        "native_two_vs_one_worker": ratio(native_two, one),
        "native_two_vs_native": ratio(native_two, native),
        "native_two_cpu_ms_per_call": cpu(NATIVE_TWO),
        # HTTP/1.1 (/bertserve/v1/embed) in one process, against gRPC in one process: grpc.aio, native port
        "http_vs_one_worker": ratio(http, one),
        "http_vs_native": ratio(http, native),
        "http_cpu_ms_per_call": cpu(HTTP),
    }
