"""Embedding defaults of a checkpoint: pooling, normalization and maximum length.

Read from the sentence-transformers files when the directory has them (modules.json, the Pooling
module's config.json, sentence_bert_config.json); otherwise mean pooling, L2-normalized, and the
longest sequence the position embeddings allow (at most 512).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bertserve.export.errors import CheckpointError

MAX_TOKENS = 512
POOLING_TYPE = "sentence_transformers.models.Pooling"
NORMALIZE_TYPE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True)
class EmbeddingDefaults:
    pooling: str  # "mean" | "cls"
    normalize: bool
    max_length: int  # tokens, [CLS] and [SEP] included
    source: str  # where these came from, for the export log


def _read_json(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None


def _pooling_mode(path: Path) -> str:
    config = _read_json(path)
    if config.get("pooling_mode_mean_tokens"):
        modes = ["mean"]
    elif config.get("pooling_mode_cls_token"):
        modes = ["cls"]
    else:
        modes = [k for k, v in config.items() if k.startswith("pooling_mode_") and v]
        raise CheckpointError(f"{path}: pooling {modes} is not supported (bertserve pools by mean or cls)")
    return modes[0]


def read_embedding_defaults(directory: Path, max_position_embeddings: int) -> EmbeddingDefaults:
    directory = Path(directory)
    limit = min(MAX_TOKENS, max_position_embeddings)
    modules_path = directory / "modules.json"
    if not modules_path.is_file():
        return EmbeddingDefaults("mean", True, limit, "defaults (no sentence-transformers config)")
    modules = _read_json(modules_path)
    types = {m.get("type"): m.get("path", "") for m in modules if isinstance(m, dict)}
    pooling = "mean"
    if POOLING_TYPE in types:
        pooling_config = directory / types[POOLING_TYPE] / "config.json"
        if pooling_config.is_file():
            pooling = _pooling_mode(pooling_config)
    max_length = limit
    st_config = directory / "sentence_bert_config.json"
    if st_config.is_file():
        declared = _read_json(st_config).get("max_seq_length")
        if isinstance(declared, int) and declared >= 2:
            max_length = min(declared, limit)
    return EmbeddingDefaults(pooling, NORMALIZE_TYPE in types, max_length, "sentence-transformers config")
