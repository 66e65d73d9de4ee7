"""Sizes in a checkpoint's config.json checked before anything is allocated: a config that asks for more
than an export can hold is one CheckpointError, not an allocator failure deep in PyTorch.

Limits: every size a positive integer; hidden_size a multiple of num_attention_heads; the float32 weights
below the 2 GiB an ONNX file holds without external data (each graph is written as one file); and the
export's peak memory (about PEAK_FACTOR x the weights: the module, the weights read, the traced graph, the
ONNX Runtime sessions that verify it) below the memory this machine has available.
"""

from __future__ import annotations

import os
from pathlib import Path

from bertserve.export.errors import CheckpointError

SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)
ONNX_FILE_LIMIT = 2 << 30  # protobuf's limit on one serialized message
PEAK_FACTOR = 6


def parameter_count(raw: dict) -> int:
    """Parameters of BertModel with a pooler, the MLM transform and the classifier (an upper bound)."""
    v, h, n, i = raw["vocab_size"], raw["hidden_size"], raw["num_hidden_layers"], raw["intermediate_size"]
    p, t = raw["max_position_embeddings"], raw["type_vocab_size"]
    id2label, num_labels = raw.get("id2label"), raw.get("num_labels")
    labels = max(
        len(id2label) if isinstance(id2label, dict) else 0, num_labels if isinstance(num_labels, int) else 2
    )
    embeddings = (v + p + t) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    heads = (h * h + h) + (h * h + h + 2 * h + v) + (h * labels + labels)
    return embeddings + n * layer + heads


def available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.3g} GiB"


def check_sizes(raw: dict, path: Path) -> None:
    """Raises CheckpointError (one line naming `path`) for sizes no export can hold."""
    for name in SIZES:
        value = raw.get(name)
        if name not in raw:
            continue  # the BertConfig default
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{path}: {name} must be a positive integer, got {value!r}")
    from bertserve.export.model import BertConfig

    defaults = BertConfig()
    sizes = {name: raw.get(name, getattr(defaults, name)) for name in SIZES}
    if sizes["hidden_size"] % sizes["num_attention_heads"]:
        raise CheckpointError(
            f"{path}: hidden_size {sizes['hidden_size']} is not a multiple of num_attention_heads "
            f"{sizes['num_attention_heads']}"
        )
    weights = 4 * parameter_count({**raw, **sizes})
    if weights >= ONNX_FILE_LIMIT:
        raise CheckpointError(
            f"{path}: these sizes make {_gib(weights)} of float32 weights; an ONNX graph file holds at most "
            f"{_gib(ONNX_FILE_LIMIT)} (hidden_size {sizes['hidden_size']}, vocab_size {sizes['vocab_size']}, "
            f"num_hidden_layers {sizes['num_hidden_layers']}, intermediate_size {sizes['intermediate_size']})"
        )
    available = available_memory()
    if available is not None and PEAK_FACTOR * weights > available:
        raise CheckpointError(
            f"{path}: exporting {_gib(weights)} of float32 weights needs about {_gib(PEAK_FACTOR * weights)} "
            f"of memory; {_gib(available)} is available"
        )
