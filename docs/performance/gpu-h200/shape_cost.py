"""A new shape's first run against its later runs on ONNX Runtime's CUDA provider, in process, through the
server's own session class (service/engine/runtime.py): on a fresh session; after a grid of power-of-two
shapes (exact shapes, as the first H200 runs' engine did); and after every shape bucket, with the random
shapes padded to theirs (service/engine/shapes.py, as the server does now). shape_cost.json holds the first
two (the third was not run: the lease's device time was spent).
Usage: python shape_cost.py MODEL_VERSION_DIR [OUT.json]"""

import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bertserve.service.engine.runtime import GraphSession
from bertserve.service.engine.shapes import buckets

ROWS, TOKENS = 64, 16384  # the GPU overlay's batch limits
SHAPES = 24  # random (batch, length) shapes per measurement
PROVIDER = os.environ.get("SHAPE_COST_PROVIDER", "cuda")  # cpu: to try the script without a GPU


def feeds(size: int, length: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(size * 1000 + length).integers(5, 90, (size, length), dtype=np.int64)
    ones = np.ones((size, length), np.int64)  # ids within any vocabulary
    return {"input_ids": ids, "attention_mask": ones, "token_type_ids": np.zeros_like(ones)}


def timed(session: GraphSession, size: int, length: int) -> float:
    started = time.perf_counter()
    session.run(feeds(size, length), ["sentence_embedding"])
    return 1e3 * (time.perf_counter() - started)


def random_shapes(seed: int, seen: set, longest: int) -> list[tuple[int, int]]:
    pick, shapes = random.Random(seed), []
    while len(shapes) < SHAPES:
        size, length = pick.randint(1, ROWS), pick.randint(5, longest)
        if size * length <= TOKENS and (size, length) not in seen:
            shapes.append((size, length))
            seen.add((size, length))
    return shapes


def measure(session: GraphSession, shapes: list[tuple[int, int]]) -> dict:
    first, again = [], []
    for size, length in shapes:
        first.append(timed(session, size, length))
        again.append(timed(session, size, length))
    ratio = [f / a for f, a in zip(first, again, strict=True)]
    return {
        "first_ms_median": statistics.median(first),
        "first_ms_max": max(first),
        "again_ms_median": statistics.median(again),
        "first_over_again_median": statistics.median(ratio),
    }


def powers(top: int, first: int) -> list[int]:
    return sorted({first << i for i in range(top.bit_length()) if first << i < top} | {top})


def warmed(path: Path, shapes: list[tuple[int, int]]) -> tuple[GraphSession, dict]:
    session = GraphSession(path, PROVIDER, 1, 1)
    started = time.perf_counter()
    for size, length in shapes:
        timed(session, size, length)
    return session, {"shapes": len(shapes), "seconds": time.perf_counter() - started}


def main() -> None:
    directory, results = Path(sys.argv[1]), {}
    longest = json.loads((directory / "manifest.json").read_text())["max_length"]
    grid = [(r, n) for n in powers(longest, 8) for r in powers(ROWS, 1) if r * n <= TOKENS]
    ladder = buckets(ROWS, TOKENS, longest)
    for precision, graph in (("fp32", "encoder.onnx"), ("fp16", "encoder_fp16.onnx")):
        cold = GraphSession(directory / graph, PROVIDER, 1, 1)
        timed(cold, 1, 8)  # the session's own first run (allocations, kernel loads) out of the figures
        seen: set = set()
        results[f"{precision} cold"] = measure(cold, random_shapes(1, seen, longest))
        session, results[f"{precision} warm-up"] = warmed(directory / graph, grid)
        results[f"{precision} after warm-up"] = measure(session, random_shapes(2, seen | set(grid), longest))
        session, results[f"{precision} bucket warm-up"] = warmed(directory / graph, ladder.all())
        padded = [ladder.shape(*shape) for shape in random_shapes(3, seen, longest)]
        results[f"{precision} after bucket warm-up"] = measure(session, padded)
    for key, value in results.items():
        print(key, {k: round(v, 2) for k, v in value.items()})
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
