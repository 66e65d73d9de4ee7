"""Embedding defaults of a checkpoint: pooling, normalization and maximum length.

Read from the sentence-transformers files when the directory has them (modules.json, the Pooling
module's config.json, sentence_bert_config.json, tokenizer_config.json); otherwise mean pooling,
L2-normalized, and the longest sequence the position embeddings allow (at most 512).
Both layouts sentence-transformers writes are read: before 6.x, modules typed `sentence_transformers.models.X`,
Pooling's `pooling_mode_<mode>_tokens` flags and `max_seq_length` in sentence_bert_config.json; from 6.x,
modules typed by their full path (`sentence_transformers.<...>.Pooling`), Pooling's `pooling_mode` and the
maximum length as the tokenizer's `model_max_length` (which sentence-transformers reads when
sentence_bert_config.json names none).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bertserve.export.errors import CheckpointError

MAX_TOKENS = 512
ST_PACKAGE = "sentence_transformers."
SUPPORTED_POOLING = ("mean", "cls")
# the Pooling flags of sentence-transformers before 6.x, and the mode each stands for
LEGACY_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


@dataclass(frozen=True)
class EmbeddingDefaults:
    pooling: str  # "mean" | "cls"
    normalize: bool
    max_length: int  # tokens, [CLS] and [SEP] included
    source: str  # where these came from, for the export log
    include_prompt: bool = True  # Pooling's: False pools without the prompt's tokens (bertserve cannot)


def _read_json(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None


def _pooling(path: Path) -> tuple[str, bool]:
    """(mode, include_prompt) of a Pooling module's config.json."""
    config = _read_json(path)
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    if "pooling_mode" in config:
        declared = config["pooling_mode"]
        modes = [declared] if isinstance(declared, str) else list(declared or [])
    else:
        modes = [mode for key, mode in LEGACY_POOLING_FLAGS.items() if config.get(key)] or ["mean"]
    if len(modes) != 1 or modes[0] not in SUPPORTED_POOLING:
        raise CheckpointError(f"{path}: pooling {modes} is not supported (bertserve pools by mean or cls)")
    return modes[0], config.get("include_prompt", True) is not False


def _module_paths(modules: list) -> dict[str, str]:
    """sentence-transformers module class name -> its folder, for the modules.json entries it wrote."""
    paths = {}
    for module in modules:
        kind = module.get("type") if isinstance(module, dict) else None
        if isinstance(kind, str) and kind.startswith(ST_PACKAGE):
            paths[kind.rpartition(".")[2]] = module.get("path", "")
    return paths


def _declared_max_length(directory: Path) -> int | None:
    for file, key in (
        ("sentence_bert_config.json", "max_seq_length"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        path = directory / file
        config = _read_json(path) if path.is_file() else {}
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 2:
            return value
    return None


def read_embedding_defaults(directory: Path, max_position_embeddings: int) -> EmbeddingDefaults:
    directory = Path(directory)
    limit = min(MAX_TOKENS, max_position_embeddings)
    modules_path = directory / "modules.json"
    if not modules_path.is_file():
        return EmbeddingDefaults("mean", True, limit, "defaults (no sentence-transformers config)")
    modules = _read_json(modules_path)
    paths = _module_paths(modules if isinstance(modules, list) else [])
    pooling, include_prompt = "mean", True
    if "Pooling" in paths:
        pooling_config = directory / paths["Pooling"] / "config.json"
        if pooling_config.is_file():
            pooling, include_prompt = _pooling(pooling_config)
    declared = _declared_max_length(directory)
    max_length = min(declared, limit) if declared else limit
    return EmbeddingDefaults(
        pooling, "Normalize" in paths, max_length, "sentence-transformers config", include_prompt
    )
