"""Baseline (a), the ceiling: ONNX Runtime in this process on the server's graph, no gRPC, ideal batches.

Ideal batches: the texts are tokenized ahead of time, sorted by length and cut into batches of a fixed
size, so padding is as small as it gets and nothing waits in a queue. The same session options and
threads as the server (intra-op N, inter-op 1). A pass encodes every text once; the reported rate is the best of
a few passes for the best batch size tried, which is what a server at saturation can at most reach.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from bertserve.bench.corpus import Corpus
from bertserve.bench.stats import latency_summary
from bertserve.service.engine.runtime import GraphSession, session_options

OUTPUT = "sentence_embedding"


@dataclass(frozen=True)
class Batch:
    feeds: dict[str, np.ndarray]
    inputs: int
    real_tokens: int
    padded_tokens: int


class DeviceSession:
    """The server's own CUDA path (service.engine.runtime.GraphSession: CUDA provider checked, I/O binding) behind
    the `run(outputs, feeds)` / `get_inputs()` of an ORT session, so the ceilings use either alike."""

    def __init__(self, graph: Path, threads: int):
        self.graph = GraphSession(graph, "cuda", threads, 1)  # StartupError unless CUDA really runs it

    def get_inputs(self):
        return self.graph.session.get_inputs()

    def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        results = self.graph.run(feeds, outputs)
        return [results[name] for name in outputs]


def make_session(graph: Path, threads: int, provider: str = "cpu") -> ort.InferenceSession | DeviceSession:
    """The server's own session options (service.engine.runtime), so any tuning there applies here too."""
    if provider == "cuda":
        return DeviceSession(graph, threads)
    options = session_options(intra_op_threads=threads, inter_op_threads=1)
    return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


def feeds_for(sequences: list[list[int]], input_names: set[str]) -> dict[str, np.ndarray]:
    width = max(len(s) for s in sequences)
    ids = np.zeros((len(sequences), width), dtype=np.int64)  # (B, T), pad id 0
    mask = np.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = sequence
        mask[row, : len(sequence)] = 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {name: array for name, array in feeds.items() if name in input_names}


def plan_batches(sequences: list[list[int]], batch_size: int, input_names: set[str]) -> list[Batch]:
    """Sorted by length, cut every `batch_size` inputs: the least padding any batcher can achieve."""
    ordered = sorted(sequences, key=len)
    batches = []
    for start in range(0, len(ordered), batch_size):
        chunk = ordered[start : start + batch_size]
        real = sum(len(s) for s in chunk)
        batches.append(
            Batch(feeds_for(chunk, input_names), len(chunk), real, len(chunk) * max(len(s) for s in chunk))
        )
    return batches


def _timed_pass(sessions: list[ort.InferenceSession], batches: list[Batch]) -> float:
    """Seconds to run every batch once; with several sessions (model instances), each on its own thread
    takes the next batch when it is free, as the server's instances do."""
    queue = iter(batches)
    lock = threading.Lock()

    def work(session: ort.InferenceSession) -> None:
        while True:
            with lock:
                batch = next(queue, None)
            if batch is None:
                return
            session.run([OUTPUT], batch.feeds)

    start = time.perf_counter()
    workers = [threading.Thread(target=work, args=(s,)) for s in sessions[1:]]
    for worker in workers:
        worker.start()
    work(sessions[0])
    for worker in workers:
        worker.join()
    return time.perf_counter() - start


def _fastest_pass(
    sessions: list[ort.InferenceSession], batches: list[Batch], passes: int, min_s: float
) -> float:
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < passes or time.perf_counter() - start < min_s:
        times.append(_timed_pass(sessions, batches))
    return min(times)


def measure_ceiling(
    graph: Path,
    tokenizer: Tokenizer,
    corpus: Corpus,
    threads: int,
    batch_sizes: list[int],
    passes: int,
    instances: int = 1,
    provider: str = "cpu",
    shared: bool = False,
    threads_per_instance: int | None = None,
    min_seconds: float = 0.0,
) -> dict:
    """Inputs/s at the best batch size, plus every batch size tried; `instances` batches at once, each
    with `threads_per_instance` threads (default threads / instances): concurrent runs of one session
    (`shared`, the server's `instance_sessions=shared`) or a session each. Each batch size keeps its
    fastest of `passes` passes, or of as many as fill `min_seconds` (a GPU's passes last milliseconds)."""
    per_instance = threads_per_instance or max(1, threads // instances)
    if shared:
        sessions = [make_session(graph, per_instance, provider)] * instances
    else:
        sessions = [make_session(graph, per_instance, provider) for _ in range(instances)]
    session = sessions[0]
    input_names = {i.name for i in session.get_inputs()}
    start = time.perf_counter()
    sequences = [e.ids for e in tokenizer.encode_batch(corpus.texts)]
    tokenize_s = time.perf_counter() - start
    by_batch_size = {}
    for batch_size in batch_sizes:
        batches = plan_batches(sequences, batch_size, input_names)
        session.run([OUTPUT], batches[len(batches) // 2].feeds)  # warm-up
        seconds = _fastest_pass(sessions, batches, passes, min_seconds)
        real = sum(b.real_tokens for b in batches)
        padded = sum(b.padded_tokens for b in batches)
        by_batch_size[batch_size] = {
            "inputs_per_s": len(sequences) / seconds,
            "tokens_per_s": real / seconds,
            "padding_ratio": padded / real,
            "seconds_per_pass": seconds,
        }
    best = max(by_batch_size, key=lambda b: by_batch_size[b]["inputs_per_s"])
    return {
        "graph": graph.name,
        "threads": threads,
        "instances": instances,
        "threads_per_instance": per_instance,
        "shared_session": shared and instances > 1,
        "inputs": len(sequences),
        "best_batch_size": best,
        **by_batch_size[best],
        "tokenize_ms_per_input": 1e3 * tokenize_s / len(sequences),
        "by_batch_size": {str(b): r for b, r in by_batch_size.items()},
    }


def measure_single_latency(
    graph: Path, tokenizer: Tokenizer, corpus: Corpus, threads: int, count: int, provider: str = "cpu"
) -> dict:
    """Latency of one input at a time (batch 1), tokenization included, over the first `count` texts."""
    session = make_session(graph, threads, provider)
    input_names = {i.name for i in session.get_inputs()}
    texts = corpus.texts[:count]
    session.run([OUTPUT], feeds_for([tokenizer.encode(texts[0]).ids], input_names))  # warm-up
    latencies = []
    for text in texts:
        start = time.perf_counter()
        session.run([OUTPUT], feeds_for([tokenizer.encode(text).ids], input_names))
        latencies.append(time.perf_counter() - start)
    return {"graph": graph.name, "threads": threads, "inputs": len(texts), **latency_summary(latencies)}
