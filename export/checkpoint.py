"""Hugging Face checkpoint directory -> the scratch BERT of `export/model.py`, loaded strictly.

Accepted: config.json with model_type "bert"; weights as model.safetensors, pytorch_model.bin or
their sharded forms (*.index.json); architectures BertModel, BertForMaskedLM (also BertForPreTraining,
whose next-sentence head is dropped) and BertForSequenceClassification. Key normalization is explicit:
the `bert.` prefix is added or removed as the module expects, the old `embeddings.position_ids` buffer
is dropped, the MLM decoder tied to the word embeddings is filled from them. Anything else that does not
fit is one CheckpointError naming the keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from bertserve.export.config_limits import check_sizes
from bertserve.export.errors import CheckpointError
from bertserve.export.model import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel

BASE, MASKED_LM, SEQUENCE_CLASSIFICATION = "BertModel", "BertForMaskedLM", "BertForSequenceClassification"
ARCHITECTURE_ALIASES = {"BertForPreTraining": MASKED_LM}
SUPPORTED_ARCHITECTURES = (BASE, MASKED_LM, SEQUENCE_CLASSIFICATION)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_DROPPED_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_NSP_HEAD = "cls.seq_relationship."
_LIST_LIMIT = 8


@dataclass
class Checkpoint:
    directory: Path
    config: BertConfig
    architecture: str  # one of SUPPORTED_ARCHITECTURES
    model: nn.Module  # eval mode, float32
    weights_file: Path
    dropped_keys: list[str] = field(default_factory=list)  # present in the file, knowingly unused

    @property
    def encoder(self) -> BertModel:
        return self.model if isinstance(self.model, BertModel) else self.model.bert

    @property
    def has_pooler(self) -> bool:
        return self.encoder.pooler is not None


def read_config(directory: Path) -> BertConfig:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json (is this a Hugging Face checkpoint directory?)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    check_sizes(raw, path)
    try:
        return BertConfig.from_dict(raw)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: {e}") from None


def find_weights_file(directory: Path) -> Path:
    for name in WEIGHT_FILES:
        if (Path(directory) / name).is_file():
            return Path(directory) / name
    raise CheckpointError(f"{directory}: no weights file (looked for {', '.join(WEIGHT_FILES)})")


def _read_one(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt/truncated files raise many kinds; all mean the same to the user
        raise CheckpointError(
            f"{path}: corrupt or truncated weights file ({type(e).__name__}: {e})"
        ) from None


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.name.endswith(".index.json"):
        try:
            shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise CheckpointError(f"{path}: unreadable shard index ({e})") from None
        weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            weights.update(_read_one(path.parent / shard))
        return weights
    weights = _read_one(path)
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise CheckpointError(f"{path}: not a state dict of tensors")
    return weights


def choose_architecture(config: BertConfig, keys: set[str]) -> str:
    declared = (config.architectures or [None])[0]
    if declared is None:  # infer from the keys
        if any(k.startswith("cls.predictions.") for k in keys):
            return MASKED_LM
        return SEQUENCE_CLASSIFICATION if any(k.startswith("classifier.") for k in keys) else BASE
    declared = ARCHITECTURE_ALIASES.get(declared, declared)
    if declared not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"architecture {declared!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return declared


def normalize_keys(
    weights: dict[str, torch.Tensor], architecture: str, config: BertConfig
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Renames/drops keys into the scratch module's names. Returns (state dict, dropped keys)."""
    state: dict[str, torch.Tensor] = {}
    dropped: list[str] = []
    wants_prefix = architecture != BASE
    for key, tensor in weights.items():
        name = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        is_head = name.startswith(("cls.", "classifier."))
        if wants_prefix and not is_head and not name.startswith("bert."):
            name = "bert." + name
        elif not wants_prefix and name.startswith("bert."):
            name = name[len("bert.") :]
        if name.endswith(_DROPPED_BUFFERS) or (architecture == MASKED_LM and name.startswith(_NSP_HEAD)):
            dropped.append(key)
            continue
        state[name] = tensor.float() if tensor.is_floating_point() else tensor
    if architecture == MASKED_LM:
        _tie_mlm_decoder(state, dropped, config)
    return state, dropped


def _tie_mlm_decoder(state: dict[str, torch.Tensor], dropped: list[str], config: BertConfig) -> None:
    decoder_bias = state.pop("cls.predictions.decoder.bias", None)
    if decoder_bias is not None:
        if "cls.predictions.bias" not in state:
            state["cls.predictions.bias"] = decoder_bias
        elif not torch.equal(decoder_bias, state["cls.predictions.bias"]):
            raise CheckpointError(
                "cls.predictions.decoder.bias differs from cls.predictions.bias (expected the same)"
            )
        else:
            dropped.append("cls.predictions.decoder.bias")
    if config.tie_word_embeddings:  # the decoder is the word embedding matrix, as transformers ties it
        if "cls.predictions.decoder.weight" in state:
            dropped.append("cls.predictions.decoder.weight")
        if "bert.embeddings.word_embeddings.weight" in state:
            state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]


def build_module(config: BertConfig, architecture: str, has_pooler: bool) -> nn.Module:
    if architecture == MASKED_LM:
        return BertForMaskedLM(config, add_pooling_layer=has_pooler)
    if architecture == SEQUENCE_CLASSIFICATION:
        return BertForSequenceClassification(config)
    return BertModel(config, add_pooling_layer=has_pooler)


def _listed(keys: list[str]) -> str:
    shown = ", ".join(keys[:_LIST_LIMIT])
    return shown + (f" (+{len(keys) - _LIST_LIMIT} more)" if len(keys) > _LIST_LIMIT else "")


def check_fit(module: nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [
        f"{k} {tuple(state[k].shape)} vs expected {expected[k]}"
        for k in sorted(set(expected) & set(state))
        if tuple(state[k].shape) != expected[k]
    ]
    problems = []
    if missing:
        problems.append(f"missing keys: {_listed(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_listed(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatches: {_listed(mismatched)}")
    if problems:
        raise CheckpointError(f"{source}: weights do not fit {type(module).__name__}: " + "; ".join(problems))


def load_checkpoint(directory: Path | str) -> Checkpoint:
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    config = read_config(directory)
    weights_file = find_weights_file(directory)
    weights = read_weights(weights_file)
    architecture = choose_architecture(config, set(weights))
    state, dropped = normalize_keys(weights, architecture, config)
    pooler_prefix = "pooler." if architecture == BASE else "bert.pooler."
    has_pooler = any(k.startswith(pooler_prefix) for k in state)
    module = build_module(config, architecture, has_pooler)
    check_fit(module, state, weights_file)
    module.load_state_dict(state, strict=True)
    module.eval()
    return Checkpoint(directory, config, architecture, module, weights_file, dropped)
