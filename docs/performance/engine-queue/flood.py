"""The engine process alone, fed over its Unix socket by a lean stand-in front (Round 19).

Starts `Engine` (service/engine/process.py) in a child process on the simulated device (`--device-ms` per
batch, no CPU), then keeps `--in-flight` unary calls of `--inputs` inputs (one by default) queued through
`--links` connections from this process, each answer sending the next call (after a random pause up to
`--spread-ms` when set, so the calls come spread out as from real fronts). The calls are pre-built: this
process costs the engine little of the two cores. Prints one JSON line: calls/s, batches/s, the mean batch,
the compute and the run per batch (the metrics `bertserve_inference_duration_seconds` and
`bertserve_encoder_run_duration_seconds`), and the engine's CPU per call by thread (`bs-engine`: its event
loop; `bs-compute`: the batch's worker).

    python docs/performance/engine-queue/flood.py --in-flight 1024 --links 8 --device-ms 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, multiprocess

from bertserve.service.engine.frame_link import FrameLink
from bertserve.service.engine.messages import inputs_out, lones_out
from bertserve.service.engine.tasks import Task, TaskOptions

ROOT = Path(__file__).resolve().parents[3]
MODEL = "all-minilm-l6-v2"
ENGINE = """
import asyncio, sys
from bertserve.service.engine.process import Engine
from bertserve.service.settings import Settings
from bertserve.service.thread_names import name_this_thread
settings = Settings(model_repo="model_repository", models=[sys.argv[2]], simulated_device_ms=float(sys.argv[3]),
                    max_batch_size=64, max_padding_ratio=4)
async def main():
    name_this_thread("bs-engine")
    engine = Engine(settings, sys.argv[1])
    await engine.start()
    print("ready", flush=True)
    await engine.serve()
asyncio.run(main())
"""


def metric_sums(directory: str) -> dict[str, float]:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, directory)
    sums: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name of process `pid`."""
    seconds: dict[str, float] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{task}"
        name = Path(f"{base}/comm").read_text().strip()
        fields = Path(f"{base}/stat").read_text().rsplit(")", 1)[1].split()
        seconds[name] = seconds.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf(
            "SC_CLK_TCK"
        )
    return seconds


async def measure(args: argparse.Namespace) -> dict:
    address = os.path.join(tempfile.mkdtemp(), "engine.sock")
    metrics_dir = tempfile.mkdtemp()
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=metrics_dir)
    command = [sys.executable, "-c", ENGINE, address, MODEL, str(args.device_ms)]
    engine = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, cwd=ROOT)
    try:
        if engine.stdout.readline().strip() != b"ready":
            raise SystemExit("the engine did not start")
        return await _flood(args, address, engine.pid, metrics_dir)
    finally:
        engine.terminate()
        engine.wait()


async def _flood(args: argparse.Namespace, address: str, pid: int, metrics_dir: str) -> dict:
    loop = asyncio.get_running_loop()
    rng = np.random.default_rng(0)
    count = max(4096, args.inputs)  # calls cycle over these inputs
    lengths = rng.integers(5, 60, size=count) if args.length == 0 else np.full(count, args.length)
    options = [TaskOptions(Task.EMBED, normalize=True)]
    rows = [np.arange(n, dtype=np.int64) + 1000 for n in lengths]
    type_rows = [np.zeros_like(row) for row in rows]
    calls = [  # each call's inputs as a front sends them (service/engine/messages.py)
        inputs_out(MODEL, options, ids, [np.zeros_like(ids) for ids in ids], None)
        for ids in (rows[k : k + args.inputs] for k in range(0, len(rows) - args.inputs + 1, args.inputs))
    ]
    sent, answered = [0], [0]

    def send(link: FrameLink) -> None:
        call = sent[0]
        sent[0] += 1
        deadline = time.monotonic() + 60
        if args.inputs == 1:  # as a front sends a unary call of one input
            one = rows[call % count], type_rows[call % count]
            link.gather(
                lones_out, (call, MODEL, MODEL, options[0], *one, None, deadline), lambda items, exc: None
            )
        else:
            link.post(("submit", call, MODEL, False, deadline, calls[call % len(calls)]))

    def received(link: FrameLink, message: tuple) -> None:
        if message[0] == "hello":
            return
        if message[0] not in ("done", "rows"):
            raise SystemExit(f"the engine answered {message!r}")
        for _ in message[1] if message[0] == "rows" else (message[1],):  # rows: several calls' answers
            answered[0] += 1
            if args.spread_ms:
                loop.call_later(random.random() * args.spread_ms / 1e3, send, link)
            else:
                send(link)

    links = []
    for _ in range(args.links):
        _, link = await loop.create_unix_connection(lambda: FrameLink(received, lambda exc: None), address)
        link.post(("hello",))
        links.append(link)
    for k in range(args.in_flight):
        send(links[k % args.links])
    await asyncio.sleep(2)  # warm
    before = answered[0], thread_cpu(pid), metric_sums(metrics_dir), time.perf_counter()
    await asyncio.sleep(args.seconds)
    after = answered[0], thread_cpu(pid), metric_sums(metrics_dir), time.perf_counter()
    answers, wall = after[0] - before[0], after[3] - before[3]
    sums = {name: value - before[2].get(name, 0.0) for name, value in after[2].items()}
    batches = sums["bertserve_batch_size_count"]
    cpu = {name: seconds - before[1].get(name, 0.0) for name, seconds in after[1].items()}
    return {
        "calls_per_s": round(answers / wall),
        "batches_per_s": round(batches / wall),
        "mean_batch": round(sums["bertserve_batch_size_sum"] / batches, 1),
        "compute_ms": round(1e3 * sums["bertserve_inference_duration_seconds_sum"] / batches, 3),
        "run_ms": round(1e3 * sums["bertserve_encoder_run_duration_seconds_sum"] / batches, 3),
        "cpu_us_per_call": {name: round(1e6 * s / answers, 1) for name, s in cpu.items() if s > 0.01},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=512)
    parser.add_argument("--links", type=int, default=8, help="connections, as fronts")
    parser.add_argument("--device-ms", type=float, default=1.0)
    parser.add_argument("--length", type=int, default=0, help="tokens per input (0: 5-59 at random)")
    parser.add_argument("--spread-ms", type=float, default=0.0)
    parser.add_argument("--inputs", type=int, default=1, help="inputs per call")
    parser.add_argument("--seconds", type=float, default=6.0)
    print(json.dumps(asyncio.run(measure(parser.parse_args()))))


if __name__ == "__main__":
    main()
