"""`bertserve bench --cores 1,2,4,8,16`: throughput as the server is given more CPU cores.

For each core count k, the server runs pinned to k CPUs (one logical CPU per physical core first, then
their hyperthread siblings; `sched_setaffinity`) in two layouts of model instances, as Triton's instance
groups: one ONNX Runtime session with k threads (`1xk`) and k instances of one thread each (`kx1`: k
concurrent runs of one shared session, the CPU default, or k sessions with `--server-setting
instance_sessions=separate`). The in-process ceiling runs in a child process pinned the same way, in both
layouts. The load generator runs
on the CPUs left over, and shares the server's only when none are left (the level says so).

Phases per server, on the mixed corpus, each at most `phase_seconds` after a short warm-up:
  bulk    requests of PER_CALL_CONCURRENCY inputs from 2 callers per instance (the server's best case),
  single  single-input calls at concurrency PER_CALL_CONCURRENCY (the per-call tax, as `single_vs_bulk`).
Writes scaling.json, scaling.md and scaling.png into --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bertserve.bench import inprocess, native_loadgen, scaling_report
from bertserve.bench.corpus import load_tokenizer, mixed_corpus
from bertserve.bench.flops import encoder_flops
from bertserve.bench.loadgen import make_requests
from bertserve.bench.machine import describe_machine
from bertserve.bench.model_setup import resolve_model
from bertserve.bench.processes import BenchError, bertserve_process, child_pythonpath
from bertserve.bench.targets import PER_CALL_CONCURRENCY, TargetRun
from bertserve.manifest import ENCODER
from bertserve.service.settings import shares_session

TEXTS_PER_CORE = 150  # the texts of a level: an in-process pass of ~2 s at any k, repeated by the servers
CEILING_BATCH_SIZES = (8, 32)


@dataclass(frozen=True)
class ScalingConfig:
    model_repo: Path
    out: Path
    cores: list[int]
    model: str | None = None
    phase_seconds: float = 10.0
    server_settings: dict[str, str] | None = None
    loadgen: str = "native"  # what sends the phases (bench/native_loadgen.py)


def cpu_order(allowed: set[int], topology: dict[int, tuple[int, int]]) -> list[int]:
    """`allowed` CPUs, one per physical core first (in core order), then the second thread of each core,
    and so on; `topology` maps a CPU to its (package, core) and may miss CPUs (taken as cores of their own)."""
    seen: dict[tuple[int, int], int] = {}
    ranked = []
    for cpu in sorted(allowed):
        core = topology.get(cpu, (-1, cpu))
        ranked.append((seen.get(core, 0), cpu))
        seen[core] = seen.get(core, 0) + 1
    return [cpu for _, cpu in sorted(ranked)]


def read_topology() -> dict[int, tuple[int, int]]:
    """CPU -> (physical package, core id) from sysfs; {} where sysfs does not say."""
    topology = {}
    for directory in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            package = int((directory / "physical_package_id").read_text())
            core = int((directory / "core_id").read_text())
        except (OSError, ValueError):
            continue
        topology[int(directory.parent.name[3:])] = (package, core)
    return topology


def pin_this_process(cpus: list[int]) -> None:
    """Every thread of this process (gRPC's and ONNX Runtime's too) onto `cpus`."""
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile


def layouts(cores: int) -> dict[str, tuple[int, int]]:
    """Name -> (instances, threads per instance): one session with every core, one session per core."""
    return {f"1x{cores}": (1, cores), f"{cores}x1": (cores, 1)}


def _ceiling_in_child(
    graph: Path, tokenizer: Path, max_length: int, texts: int, cpus: list[int], shared: bool
) -> dict:
    """The in-process ceiling of each layout on the mixed corpus's first `texts` texts, in a child pinned to
    `cpus` (nothing else of ours runs meanwhile); `shared`: instances run one session, as the servers'."""
    argv = [sys.executable, "-m", "bertserve.bench.scaling", "--graph", str(graph), "--tokenizer", str(tokenizer),
            "--max-length", str(max_length), "--texts", str(texts), "--cpus", ",".join(map(str, cpus)),
            *(["--shared"] if shared else [])]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, env=os.environ | child_pythonpath(), check=False
    )
    if done.returncode != 0:
        raise BenchError(f"in-process ceiling on {len(cpus)} core(s) failed: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout)


def ceiling_main() -> None:
    parser = argparse.ArgumentParser(description="in-process ceilings pinned to --cpus (bench --cores)")
    parser.add_argument("--graph", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--max-length", type=int, required=True)
    parser.add_argument("--texts", type=int, required=True)
    parser.add_argument("--cpus", required=True)
    parser.add_argument("--shared", action="store_true", help="instances run one shared session")
    args = parser.parse_args()
    cpus = [int(c) for c in args.cpus.split(",")]
    os.sched_setaffinity(0, cpus)  # before any session: ONNX Runtime's threads inherit it
    tokenizer = load_tokenizer(args.tokenizer, args.max_length)
    corpus = mixed_corpus(tokenizer, limit=args.texts)
    results = {}
    for name, (instances, threads) in layouts(len(cpus)).items():
        found = inprocess.measure_ceiling(
            args.graph, tokenizer, corpus, len(cpus), list(CEILING_BATCH_SIZES), 2, instances,
            shared=args.shared, threads_per_instance=threads,
        )  # fmt: skip
        results[name] = {k: found[k] for k in ("inputs_per_s", "best_batch_size", "inputs")}
    json.dump(results, sys.stdout)


async def _server_phases(
    server, model: str, bulk, single, instances: int, seconds: float, log, native: Path | None
) -> dict:
    """Starts `server`, runs the bulk then the single phase against it (TargetRun's phases), stops it."""
    target = TargetRun(server, model, workload=None, log=log, native=native)
    phases = {"startup_s": await server.start(300.0)}
    try:
        plan = [("bulk", bulk, max(2, 2 * instances)), ("single", single, PER_CALL_CONCURRENCY)]
        async with target.connected(PER_CALL_CONCURRENCY):
            phases |= await target.closed_phases(plan, seconds)
    finally:
        phases["exit_code"] = await server.stop()
    return phases


async def run(config: ScalingConfig, log=lambda message: print(message, file=sys.stderr, flush=True)) -> dict:
    started = time.perf_counter()
    config.out.mkdir(parents=True, exist_ok=True)
    order = cpu_order(os.sched_getaffinity(0), read_topology())
    too_many = [k for k in config.cores if k > len(order)]
    if too_many:
        raise BenchError(f"--cores {too_many}: this process may use only {len(order)} CPU(s)")
    machine = describe_machine(max(config.cores))
    model = resolve_model(config.model_repo, config.model, None, config.out, lambda _: None)
    tokenizer = load_tokenizer(model.tokenizer_path, model.manifest.max_length)
    dims = model.manifest.dimensions
    flops_of = lambda tokens: encoder_flops(dims, tokens)  # noqa: E731
    mode = (config.server_settings or {}).get("instance_sessions", "auto")
    shared = shares_session(mode, "cpu")  # the scaling servers run on the CPU
    native, loadgen = native_loadgen.choose(config.loadgen)
    if "native_unavailable" in loadgen:
        log(f"warning: {loadgen['native_unavailable']}")
    levels = []
    for cores in config.cores:
        cpus, rest = order[:cores], order[cores:]
        client = rest or order
        log(f"  {cores} core(s): server on CPUs {cpus}, load generator on {client}")
        corpus = mixed_corpus(tokenizer, limit=TEXTS_PER_CORE * cores)
        level = {"cores": cores, "cpus": cpus, "client_cpus": client, "client_shares_cpus": not rest,
                 "texts": len(corpus.texts)}  # fmt: skip
        level["inprocess"] = _ceiling_in_child(
            model.graph(ENCODER),
            model.tokenizer_path,
            model.manifest.max_length,
            len(corpus.texts),
            cpus,
            shared,
        )
        for name, ceiling in level["inprocess"].items():
            log(
                f"    in-process {name:<5} {ceiling['inputs_per_s']:8.1f} inputs/s (batch {ceiling['best_batch_size']})"
            )
        pin_this_process(client)
        # the same texts, repeated so that every phase runs into its time limit, whatever the speed
        repeat = 250
        texts, tokens = corpus.texts * repeat, corpus.tokens * repeat
        bulk = make_requests(texts, tokens, PER_CALL_CONCURRENCY, flops_of)
        single = make_requests(texts, tokens, 1, flops_of)
        level["servers"] = {}
        for name, (instances, threads) in layouts(cores).items():
            settings = {"provider": "cpu"} | (config.server_settings or {}) | {"instances": str(instances)}
            server = bertserve_process(
                f"server-{name}", model.repo, model.spec, threads, config.out / "logs", settings
            )
            server.env.update(child_pythonpath())
            server.cpus = cpus
            level["servers"][name] = await _server_phases(
                server, model.name, bulk, single, instances, config.phase_seconds, log, native
            )
        pin_this_process(order)
        levels.append(level)
    result = {
        "bench_version": 1,
        "kind": "scaling",
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine | {"load_average_at_end": os.getloadavg()},
        "model": {"name": model.name, "version": model.version, "graph": model.manifest.graphs[ENCODER].file},
        "settings": {
            "cores": config.cores,
            "phase_seconds": config.phase_seconds,
            "cpu_order": order,
            "server_settings": config.server_settings or {},
            "kx1_shared_session": shared,
            "load_generator": loadgen,
        },  # fmt: skip
        "levels": levels,
        "summary": scaling_report.summary(levels),
    }
    result["seconds"] = time.perf_counter() - started
    for path in scaling_report.write(result, config.out):
        log(f"  wrote {path}")
    return result


if __name__ == "__main__":
    ceiling_main()
