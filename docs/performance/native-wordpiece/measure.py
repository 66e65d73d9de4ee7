"""The plain-text WordPiece in C++ (`native_tokenizer`) against the tokenizers library, in process and in a
server against the simulated device.

In process: `ModelTokenizer.encode` (ids only) per text, one text and 32 texts a call, with the library and
its normalizer, the library's twin without it (the plain path of Round 20), and the native WordPiece. Server:
`--workers 2 --native-port` against a 1 ms simulated device, single-input calls at c=256 and 32-input calls
at c=2 from the native load generator, `native_tokenizer` false and true in turns; CPU per call of every
process. Run from the repository root: `python docs/performance/native-wordpiece/measure.py [ROUNDS]`."""

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from bertserve.bench import gpu
from bertserve.bench.loadgen import Request
from bertserve.bench.native_loadgen import NativePhase, choose
from bertserve.bench.processes import bertserve_process, child_pythonpath, free_port
from bertserve.repository import read_manifest
from bertserve.service.engine.tokenization import ModelTokenizer

sys.path.insert(0, str(Path(__file__).parents[1] / "native-unary"))
from unary_cost import METHODS, measured  # noqa: E402

MODEL = "all-minilm-l6-v2"
REPO = Path("model_repository")
TEXTS = [line.strip() for line in Path("bench/corpus/mixed.txt").read_text().splitlines() if line.strip()]
PHASES = {"single c=256": (1, 256, 8000), "32-input c=2": (32, 2, 1200)}  # texts a call, callers, calls


def tokenizers() -> dict[str, ModelTokenizer]:
    folder = REPO / MODEL / "1"
    manifest = read_manifest(folder)
    made = {}
    for name, native in (("library", False), ("library, plain twin", False), ("native", True)):
        made[name] = ModelTokenizer(
            folder / "tokenizer.json", manifest.tokenizer, manifest.max_length, native
        )
    made["library"]._plain = None  # every text through the library's normalizer
    return made


def in_process(rounds: int) -> dict:
    results: dict[str, dict[int, list[float]]] = {}
    for _ in range(rounds):
        for name, tokenizer in tokenizers().items():
            for size in (1, 32):
                start = time.process_time()
                for i in range(0, 4000, size):
                    tokenizer.encode(TEXTS[i % 1984 : i % 1984 + size], True, detailed=False)
                us = (time.process_time() - start) / 4000 * 1e6
                results.setdefault(name, {}).setdefault(size, []).append(round(us, 1))
    return results


async def server_phase(native: bool, size: int, callers: int, calls: int) -> dict:
    requests = [Request(TEXTS[i : i + size], 10 * size, 1.0) for i in range(0, len(TEXTS) - size, size)]
    requests = (requests * (calls // len(requests) + 1))[:calls]
    port = free_port()
    settings = gpu.SERVER_SETTINGS | {
        "provider": "cpu", "simulated_device_ms": "1", "native_port": str(port), "workers": "2",
        "native_tokenizer": str(native).lower(),
    }  # fmt: skip
    server = bertserve_process("fp", REPO, MODEL, 1, Path(tempfile.mkdtemp()), settings)
    server.env.update(child_pythonpath())
    await server.start(180)
    try:
        binary, _ = choose("native")
        phase = NativePhase(
            binary,
            f"127.0.0.1:{port}",
            METHODS["embed"],
            requests,
            callers,
            requests[:64],
            connections=callers,
        )
        result, cpu_s = await measured(phase, server.process.pid)
    finally:
        await server.stop()
    n = len(result.latencies)
    latencies = sorted(result.latencies)
    return {
        "inputs_per_s": round(n * size / result.seconds),
        "p50_ms": round(1000 * latencies[n // 2], 2),
        "server_cpu_ms_per_call": round(1000 * cpu_s / n, 3),
    }


async def servers(rounds: int) -> list[dict]:
    rows = []
    for round_ in range(rounds):
        for name, (size, callers, calls) in PHASES.items():
            for native in (False, True):
                row = {"round": round_ + 1, "phase": name, "native_tokenizer": native}
                row |= await server_phase(native, size, callers, calls)
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    print(json.dumps({"in_process_us_per_text": in_process(3)}), flush=True)
    asyncio.run(servers(rounds))


if __name__ == "__main__":
    main()
