"""The batch cuts in a closed loop without a server: a queue held at QUEUE inputs of the quick bench's mixed
corpus (MiniLM's token counts), each batch cut from it, priced by a line (seconds per batch and per padded
token, at the GPU overlay's shape buckets), its inputs replaced by new ones. Prints inputs per second of
device time, mean batch, padding (bucket tokens / real) and the cut's own time per batch.
Usage: python closed_loop.py MODEL_REPO [FIXED_S PER_TOKEN_S]   (default: the H200's line with CUDA graphs)
"""

import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bertserve.bench.corpus import load_tokenizer, mixed_corpus
from bertserve.service.engine.batch_policy import cut_batch, cut_by_cost
from bertserve.service.engine.shapes import buckets

BUCKETS = buckets(64, 16384, 256)
INPUTS = 20_000


@dataclass
class Queued:
    length: int


def run(lengths: list[int], queue: int, line: tuple[float, float], cut) -> str:
    pick = random.Random(1)
    pending = [Queued(pick.choice(lengths)) for _ in range(queue)]
    seconds = cut_s = 0.0
    done = real = padded = batches = 0
    while done < INPUTS:
        started = time.perf_counter()
        chosen = set(cut(pending, line))
        cut_s += time.perf_counter() - started
        batch = [pending[i] for i in sorted(chosen)]
        pending = [one for i, one in enumerate(pending) if i not in chosen]
        rows, length = BUCKETS.shape(len(batch), max(one.length for one in batch))
        seconds += line[0] + line[1] * rows * length
        done, batches = done + len(batch), batches + 1
        real, padded = real + sum(one.length for one in batch), padded + rows * length
        pending += [Queued(pick.choice(lengths)) for _ in batch]
    return f"{done / seconds:8.0f} inputs/s, batch {done / batches:5.1f}, padding {padded / real:4.2f}, cut {1e6 * cut_s / batches:4.0f} us"


CUTS = {
    "padding 4 (GPU overlay)": lambda p, line: cut_batch(p, 64, 16384, 4.0),
    "padding 1.5": lambda p, line: cut_batch(p, 64, 16384, 1.5),
    "cost": lambda p, line: cut_by_cost(
        p, 64, 16384, 4.0, (BUCKETS.rows, BUCKETS.lengths), BUCKETS.shape, line
    ),
}

if __name__ == "__main__":
    repo = Path(sys.argv[1]) / "all-minilm-l6-v2"
    line = (float(sys.argv[2]), float(sys.argv[3])) if len(sys.argv) > 3 else (0.45e-3, 0.5e-6)
    corpus = mixed_corpus(load_tokenizer(sorted(repo.glob("*/tokenizer.json"))[-1], 256), limit=160)
    for queue in (16, 64, 128, 256):
        for name, cut in CUTS.items():
            print(f"queue {queue:3d}  {name:24s} {run(corpus.tokens, queue, line, cut)}")
