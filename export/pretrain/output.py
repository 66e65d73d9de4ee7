"""What pretraining writes: a Hugging Face BertForMaskedLM checkpoint directory (config.json,
model.safetensors, tokenizer files) that `bertserve export` takes, and the trained tensors alone
(`trained.safetensors`, small when few layers train) with `pretrain.json` (recipe, figures, checksums, and
which tensors are the base checkpoint's unchanged). `assemble` rebuilds the full checkpoint from the base
checkpoint and the trained tensors, checking both against the record's sha256.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bertserve.export.checkpoint import find_weights_file, read_weights
from bertserve.export.errors import ExportError
from bertserve.export.heads.assemble import SAFETENSORS_METADATA, write_checkpoint_directory
from bertserve.export.model import BertForMaskedLM
from bertserve.manifest import sha256_file
from bertserve.repository import PretrainingInfo

COMMITTED_DIR = Path(__file__).parent / "weights"  # the default fill-mask model's pretrained layers
CHECKPOINT_SUBDIR = "checkpoint"
TRAINED_FILE = "trained.safetensors"
RECORD_FILE = "pretrain.json"
_CONFIG_DROPPED = ("_name_or_path", "transformers_version", "gradient_checkpointing", "use_cache")


class PretrainedWeightsError(ExportError):
    """Missing or altered pretrained weights, or a base checkpoint other than the one they were trained on."""


def checkpoint_state(model: BertForMaskedLM) -> dict[str, torch.Tensor]:
    """Hugging Face BertForMaskedLM names; the tied decoder and the position-id buffer left out."""
    return {
        name: tensor.detach().clone().contiguous()
        for name, tensor in model.state_dict().items()
        if not name.startswith("cls.predictions.decoder.") and not name.startswith("bert.pooler.")
    }


def _write_directory(base_dir: Path, out_dir: Path, state: dict[str, torch.Tensor], card: str) -> Path:
    """A BertForMaskedLM checkpoint: the base's config (tied decoder), `state`, the base's tokenizer files."""
    config = json.loads((Path(base_dir) / "config.json").read_text())
    for key in _CONFIG_DROPPED:
        config.pop(key, None)
    config |= {"architectures": ["BertForMaskedLM"], "tie_word_embeddings": True}
    return write_checkpoint_directory(Path(base_dir), Path(out_dir), config, state, card)


def write_checkpoint(model: BertForMaskedLM, base_dir: Path, out_dir: Path, card: str) -> Path:
    return _write_directory(base_dir, out_dir, checkpoint_state(model), card)


def file_entry(path: Path) -> dict:
    return {"sha256": sha256_file(path), "size_bytes": path.stat().st_size}


def write_record(out_dir: Path, record: dict) -> Path:
    path = Path(out_dir) / RECORD_FILE
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def write_trained(model: BertForMaskedLM, names: list[str], out_dir: Path, record: dict) -> Path:
    """trained.safetensors (the tensors that trained) + pretrain.json (record + their sha256)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    state = checkpoint_state(model)
    save_file({n: state[n] for n in names}, str(out_dir / TRAINED_FILE), metadata=SAFETENSORS_METADATA)
    return write_record(out_dir, record | {"files": {TRAINED_FILE: file_entry(out_dir / TRAINED_FILE)}})


def shared_modules(trained: list[str], num_layers: int) -> list[str]:
    """Module prefixes none of whose tensors are in `trained`: the base's embeddings and frozen layers."""
    groups = ["bert.embeddings."] + [f"bert.encoder.layer.{i}." for i in range(num_layers)]
    return [g.rstrip(".") for g in groups if not any(n.startswith(g) for n in trained)]


def shared_with_base(model: BertForMaskedLM, names: list[str]) -> list[str]:
    return shared_modules(names, len(model.bert.encoder.layer))


def encoder_state(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's embeddings and encoder layers under `bert.` names (pooler, heads, buffers left out)."""
    state = {k if k.startswith("bert.") else f"bert.{k}": v for k, v in weights.items()}
    return {
        k: v
        for k, v in state.items()
        if k.startswith(("bert.embeddings.", "bert.encoder.")) and "position_ids" not in k
    }


def assemble(base_dir: Path, weights_dir: Path, out_dir: Path) -> Path:
    """base checkpoint + trained.safetensors -> a full BertForMaskedLM checkpoint directory."""
    base_dir, weights_dir = Path(base_dir), Path(weights_dir)
    for name in (RECORD_FILE, TRAINED_FILE):
        if not (weights_dir / name).is_file():
            raise PretrainedWeightsError(
                f"{weights_dir / name} not found: run `bertserve pretrain` (or make pretrain-fill-mask)"
            )
    record = json.loads((weights_dir / RECORD_FILE).read_text())
    expected = record["files"][TRAINED_FILE]["sha256"]
    if sha256_file(weights_dir / TRAINED_FILE) != expected:
        raise PretrainedWeightsError(f"{weights_dir / TRAINED_FILE}: sha256 differs from {RECORD_FILE}'s")
    base_weights = find_weights_file(base_dir)
    if sha256_file(base_weights) != record["base"]["model_sha256"]:
        raise PretrainedWeightsError(
            f"{base_weights} is not the base checkpoint these weights were trained on"
        )
    state = encoder_state(read_weights(base_weights))
    # packed tensors may be float16 (pack.py): the checkpoint is float32, as the base
    state |= {k: v.to(torch.float32) for k, v in load_file(str(weights_dir / TRAINED_FILE)).items()}
    written = _write_directory(base_dir, out_dir, state, record.get("card", ""))
    write_record(written, record)  # `bertserve export` records a packed record's figures in the manifest
    return written


def pretraining_info(checkpoint_dir: Path) -> PretrainingInfo | None:
    """The manifest's summary of a checkpoint assembled from packed weights (pack.py's record), else None."""
    path = Path(checkpoint_dir) / RECORD_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    if "stages" not in record:  # one stage's own record: its base is not a released model
        return None
    return PretrainingInfo(
        base=record["base"]["name"],
        base_model_sha256=record["base"]["model_sha256"],
        shared_with_base=record["shared_with_base"],
        stages=len(record["stages"]),
        steps=sum(stage["recipe"]["steps"] for stage in record["stages"]),
        held_out=record["held_out"]["after"],
    )
