"""Where the model's time goes: ONNX Runtime's own profiler over one pass of ideal batches.

The summary (time per operator type, and how much of each run is outside the operators) goes into
bench.json; the raw trace is kept in OUT/profiles/ (open it in chrome://tracing or Perfetto).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import onnxruntime as ort
from tokenizers import Tokenizer

from bertserve.bench.corpus import Corpus
from bertserve.bench.inprocess import OUTPUT, plan_batches
from bertserve.service.engine.runtime import providers_for, session_options


def op_profile(
    graph: Path,
    tokenizer: Tokenizer,
    corpus: Corpus,
    threads: int,
    batch_size: int,
    out: Path,
    provider: str = "cpu",
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    options = session_options(intra_op_threads=threads, inter_op_threads=1)
    options.enable_profiling = True
    options.profile_file_prefix = str(out / f"ort-{graph.stem}-batch{batch_size}")
    providers = providers_for(provider)  # as the server's sessions ask for them
    session = ort.InferenceSession(str(graph), options, providers=providers)
    input_names = {i.name for i in session.get_inputs()}
    batches = plan_batches([e.ids for e in tokenizer.encode_batch(corpus.texts)], batch_size, input_names)
    for batch in batches:
        session.run([OUTPUT], batch.feeds)
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())

    by_op: dict[str, float] = defaultdict(float)
    run_us = 0.0
    for event in events:
        if event.get("cat") == "Node" and "op_name" in event.get("args", {}):
            by_op[event["args"]["op_name"]] += event["dur"]
        elif event.get("cat") == "Session" and event.get("name") == "model_run":
            run_us += event["dur"]
    node_us = sum(by_op.values())
    return {
        "graph": graph.name,
        "batch_size": batch_size,
        "runs": len(batches),
        "run_ms": run_us / 1e3,
        "operators_ms": node_us / 1e3,
        "outside_operators_share": 1 - node_us / run_us if run_us else None,  # ORT's own work between kernels
        "share_by_op": {op: us / node_us for op, us in sorted(by_op.items(), key=lambda kv: -kv[1])}
        if node_us
        else {},
        "trace": str(trace.relative_to(out.parent)),
    }
