"""The simulated-device target: what the server's fronts can feed a device, measured on any machine.

bertserve with `simulated_device_ms` (service/engine/simulated_device.py: each encoder batch answered after a sleep
that costs no CPU, as a GPU's batch) takes single-input Embed callers (PER_CALL_CONCURRENCY of them, the
single-input phase of server-fp32) once per workers value (`workers`, BERTSERVE_WORKERS). A value the server
refuses (it exits at start, or runs fewer processes than the fronts asked for: a server that does not know
the setting) is skipped with a note. Its CPU is the whole process tree's (bench/process_tree.py), so
`cpu_ms_per_call` covers every front, the engine and the supervisor.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bertserve.bench.loadgen import Request
from bertserve.bench.processes import BenchError, bertserve_process, child_pythonpath
from bertserve.bench.targets import PER_CALL_CONCURRENCY, TargetRun

WORKERS = ("1", "2", "auto")  # the server's `workers` values, in measuring order
STARTUP_TIMEOUT_S = 180.0
KEYS = ("inputs_per_s", "requests_per_s", "p50_ms", "p99_ms", "server_cpu_cores", "client_cpu_cores")


def _calls(single: list[Request], calls: int) -> list[Request]:
    """The single-input requests repeated up to `calls` (a phase long enough for the CPU's clock ticks)."""
    return [single[i % len(single)] for i in range(max(calls, len(single)))]


def _row(workers: str, processes: int, startup_s: float, exit_code: int | None, phase: dict) -> dict:
    server = phase.get("server") or {}
    return {
        "workers": workers,
        "processes": processes,  # the server's process tree once ready
        "startup_s": startup_s,
        "exit_code": exit_code,
        **{key: phase.get(key) for key in KEYS},
        # CPU of every process of the server per single-input call (an input each)
        "cpu_ms_per_call": phase.get("server_cpu_ms_per_input"),
        "batch_size_mean": server.get("batch_size_mean"),
        "device_busy_fraction": server.get("inference_busy_fraction"),
        "calls": phase["requests_ok"],
        "errors": phase["errors"],
        "stopped_early": phase["stopped_early"],
        "phase": phase,
    }


async def _one(
    workers: str, settings: dict[str, str], repo: Path, spec: str, model: str, threads: int, logs: Path,
    requests: list[Request], time_limit_s: float | None, log: Callable[[str], None], native: Path | None,
) -> dict:  # fmt: skip
    """One server with `workers`: its row, or {"skipped": why} when it refused the value."""
    name = f"simulated-device-w{workers}"
    server = bertserve_process(name, repo, spec, threads, logs, settings | {"workers": workers})
    server.env.update(child_pythonpath())
    try:
        startup_s = await server.start(STARTUP_TIMEOUT_S)
    except BenchError as error:  # its first line, and its log's last (the server's reason)
        lines = str(error).splitlines()
        why = lines[0] if len(lines) < 2 else f"{lines[0]} {lines[-1].strip()}"
        return {"workers": workers, "skipped": f"the server refused workers={workers}: {why}"}
    try:
        processes = server.processes() or 0
        if workers.isdigit() and int(workers) > 1 and processes <= int(workers):
            return {
                "workers": workers,
                "skipped": f"workers={workers} ran {processes} process(es), not a supervisor, an engine and "
                f"{workers} fronts: this server does not take BERTSERVE_WORKERS",
            }
        log(f"  {name} ready in {startup_s:.1f} s, {processes} process(es)")
        run = TargetRun(server, model, None, log, native, per_caller=True)  # one process per connection
        async with run.connected(PER_CALL_CONCURRENCY):
            plan = [("single", requests, PER_CALL_CONCURRENCY)]
            phase = (await run.closed_phases(plan, time_limit_s))["single"]
    finally:
        exit_code = await server.stop()
    return _row(workers, processes, startup_s, exit_code, phase)


async def measure(
    repo: Path, spec: str, model: str, single: list[Request], settings: dict[str, str], device_ms: float,
    calls: int, threads: int, logs: Path, time_limit_s: float | None, log: Callable[[str], None],
    native: Path | None, notes: list[str], workers_values: tuple[str, ...] = WORKERS,
) -> dict:  # fmt: skip
    """Every workers value in turn; a skipped one adds its reason to `notes`. `settings`: the bertserve
    targets' own; the device's sessions are loaded on the CPU and never run."""
    settings = settings | {"provider": "cpu", "simulated_device_ms": f"{device_ms:g}"}
    requests = _calls(single, calls)
    rows = {}
    for workers in workers_values:
        row = await _one(
            workers, settings, repo, spec, model, threads, logs, requests, time_limit_s, log, native
        )
        if "skipped" in row:
            notes.append(f"simulated-device: {row['skipped']}")
            log(f"  {notes[-1]}")
        rows[workers] = row
    return summarize(rows, device_ms)


def _rate(row: dict | None) -> float | None:
    return None if row is None or "skipped" in row else row["inputs_per_s"]


def summarize(rows: dict[str, dict], device_ms: float) -> dict:
    """bench.json's `simulated_device`, with `front_cpu_ms_per_call`: the CPU per call of the measured run
    with the most processes (where the split between processes costs most; the first such run in order)."""
    measured = [row for row in rows.values() if "skipped" not in row]
    widest = max(measured, key=lambda row: row["processes"], default=None)
    one, two = _rate(rows.get("1")), _rate(rows.get("2"))
    return {
        "device_ms_per_batch": device_ms,
        "concurrency": PER_CALL_CONCURRENCY,
        "workers": rows,
        "two_vs_one_worker": two / one if one and two is not None else None,
        "front_cpu_ms_per_call": widest and widest["cpu_ms_per_call"],
        "front_cpu_workers": widest and widest["workers"],
    }
