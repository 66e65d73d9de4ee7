"""Batches cut by padding against by cost (setting `batch_cut`), on a simulated device shaped like an H200's
MiniLM batches, so the comparison runs on any machine: each batch sleeps a fixed time plus a time per padded
token (`simulated_device_ms`, `simulated_device_us_per_token`; service/engine/simulated_device.py), both
SCALE times the H200's (about 0.45 ms and 0.5 us with CUDA graphs, docs/performance/gpu-h200), slow enough
that a 2-core machine's fronts feed it. The servers take the GPU overlay's batch settings and shape buckets;
each round starts one server per cut in turn and runs single-input callers at each concurrency, then 2
callers of 32 inputs, with the bench's native load generator (`make gpu-bundle` or `make bench` builds it).
Usage: python ab.py MODEL_REPO OUT_DIR [ROUNDS]   (writes OUT_DIR/ab.json and prints a table)
"""

import asyncio
import json
import statistics
import sys
from pathlib import Path

from bertserve.bench import gpu, native_loadgen
from bertserve.bench.corpus import load_tokenizer, mixed_corpus
from bertserve.bench.loadgen import make_requests
from bertserve.bench.processes import bertserve_process, child_pythonpath
from bertserve.bench.targets import TargetRun

MODEL, MAX_LENGTH = "all-minilm-l6-v2", 256
SCALE = 20
DEVICE = {"simulated_device_ms": f"{0.45 * SCALE:g}", "simulated_device_us_per_token": f"{0.5 * SCALE:g}"}
CUTS = ("padding", "cost")
CONCURRENCY = (1, 16, 64, 256)
CALLS_PER_CALLER = 20  # single-input requests per caller and phase (at least 300 in all)


async def one_server(repo: Path, cut: str, texts: list[str], tokens: list[int], logs: Path) -> dict:
    settings = gpu.SERVER_SETTINGS | DEVICE | {"provider": "cpu", "batch_shapes": "buckets", "batch_cut": cut}
    server = bertserve_process(f"batch-cut-{cut}", repo, MODEL, 1, logs, settings)
    server.env.update(child_pythonpath())
    await server.start(180.0)
    single = make_requests(texts, tokens, 1, lambda n: 0.0)
    bulk = make_requests(texts, tokens, 32, lambda n: 0.0)
    plan = [(f"c={c}", (single * 64)[: max(300, CALLS_PER_CALLER * c)], c) for c in CONCURRENCY]
    plan.append(("2x32", bulk * 8, 2))
    try:
        run = TargetRun(server, MODEL, None, print, native_loadgen.find_binary(), per_caller=True)
        phases = {}
        for key, requests, c in plan:
            async with run.connected(c):
                phases |= await run.closed_phases([(key, requests, c)], 60.0)
    finally:
        await server.stop()
    return {
        key: {
            "inputs_per_s": p["inputs_per_s"],
            "p50_ms": p["p50_ms"],
            "batch_size_mean": p["server"].get("batch_size_mean"),
            "padding": p["server"].get("padding_ratio_mean_per_batch"),
        }
        for key, p in phases.items()
    }


async def main(repo: Path, out: Path, rounds: int) -> None:
    tokenizer = load_tokenizer(sorted((repo / MODEL).glob("*/tokenizer.json"))[-1], MAX_LENGTH)
    mixed = mixed_corpus(tokenizer, limit=160)  # the quick bench's corpus
    results = {cut: [] for cut in CUTS}
    for _ in range(rounds):
        for cut in CUTS:
            results[cut].append(await one_server(repo, cut, mixed.texts, mixed.tokens, out / "logs"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "ab.json").write_text(json.dumps({"device": DEVICE, "results": results}, indent=1))
    print("| phase | padding: inputs/s (p50 ms, batch, padding) | cost: same | cost / padding |")
    print("|---|---|---|---|")
    for key in results[CUTS[0]][0]:
        cells = {}
        for cut in CUTS:
            runs = [r[key] for r in results[cut]]
            med = {f: statistics.median(run[f] or 0 for run in runs) for f in runs[0]}
            cells[cut] = med
        a, b = cells["padding"], cells["cost"]
        print(
            f"| {key} | " + " | ".join(
                f"{c['inputs_per_s']:.0f} ({c['p50_ms']:.0f}, {c['batch_size_mean']:.1f}, {c['padding']:.2f})" for c in (a, b)
            ) + f" | {b['inputs_per_s'] / a['inputs_per_s']:.2f} |"
        )  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 3))
