"""The handler's floor: the p50 at c=1 of a grpc.aio front with nothing of bertserve's path.

bench/handler_floor_server.py is a minimal grpc.aio server whose Embed handler tokenizes and runs the
same fp32 graph, with the graph on the event loop (`inline`) or in one worker thread (`thread`). After the
targets, `measure` starts one server per mode and sends it server-fp32's c=1 calls through the same load
generator, each phase between two in-process measurements of one input at a time (the figure it is held
against, as server-fp32's own c=1 phase is). Less that in-process p50, `inline` is about the least that
`p50_c1_minus_inprocess_ms` can read with grpc.aio on the machine, and `thread` the least with the loop
kept free; what bertserve reads above `thread` is its own path.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

from bertserve.bench.analysis import adjacent
from bertserve.bench.handler_floor_server import MODES
from bertserve.bench.loadgen import between_checks
from bertserve.bench.processes import ServerProcess, child_pythonpath, free_port
from bertserve.bench.targets import TargetRun, Workload
from bertserve.manifest import ENCODER


def process(
    mode: str, graph: Path, tokenizer: Path, max_length: int, threads: int, provider: str, log_dir: Path
) -> ServerProcess:
    port = free_port()
    argv = [
        sys.executable, "-m", "bertserve.bench.handler_floor_server", "--graph", str(graph),
        "--tokenizer", str(tokenizer), "--max-length", str(max_length), "--threads", str(threads),
        "--port", str(port), "--mode", mode, "--provider", provider,
    ]  # fmt: skip
    name = f"handler-floor-{mode}"
    server = ServerProcess(name, argv, port, log_dir / f"{name}.log", health_checked=False)
    server.env.update(child_pythonpath())
    return server


def summarize(phases: dict[str, dict], inprocess_single: dict) -> dict:
    """Mode -> its p50 at c=1, that less the in-process p50 (the mean of the phase's `single_p50_checks`,
    measured right before and after it, else the run's first), and what its phase answered. A phase with
    failed calls, or no p50, gives no figure (None)."""
    out = {}
    for mode, phase in phases.items():
        base = adjacent(phase, inprocess_single.get("p50_ms"), "single_p50_checks")
        p50 = phase["p50_ms"]
        valid = not phase["errors"] and phase["requests_ok"] > 0 and math.isfinite(p50)
        out[mode] = {
            "p50_ms": p50 if valid else None,
            "p50_minus_inprocess_ms": p50 - base if valid and base is not None else None,
            "single_p50_checks": phase.get("single_p50_checks", []),
            "reply_inference_ms_mean": phase["reply_inference_ms_mean"],  # the session's run, timed inside
            "requests_ok": phase["requests_ok"],
            "errors": phase["errors"],
        }
    return out


async def measure(
    model,
    workload: Workload,
    threads: int,
    provider: str,
    inprocess_single: dict,
    native: Path | None,
    log_dir: Path,
    log: Callable[[str], None],
    time_limit_s: float | None,
) -> dict:
    """server-fp32's c=1 phase (`workload.mixed`) again against each mode's server, one at a time, each
    between two calls of `workload.single_check`; `model`: bench.model_setup.ModelUnderTest."""
    phases = {}
    graph, max_length = model.graph(ENCODER), model.manifest.max_length
    for mode in MODES:
        server = process(mode, graph, model.tokenizer_path, max_length, threads, provider, log_dir)
        target = TargetRun(server, model.name, None, log, native)
        try:
            await server.start(workload.startup_timeout_s)
            async with target.connected(1):
                measured = target.closed_phases([(mode, list(workload.mixed), 1)], time_limit_s)
                found, singles = await between_checks(workload.single_check, measured)
                phases[mode] = found[mode] | {"single_p50_checks": singles}
        finally:
            await server.stop()
    return summarize(phases, inprocess_single)
