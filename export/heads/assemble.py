"""Head weight files (small, committed with sha256 checksums) and the Hugging Face checkpoint directories
assembled from them: the base encoder's weights + a trained head, in the layout `transformers` and
`export_model` load (config.json with architectures/labels, model.safetensors, tokenizer files).

`heads.json` in a heads directory records, for each head file, its sha256, plus the labels, the
training settings and the held-out figures measured when the heads were trained.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bertserve.export.errors import ExportError
from bertserve.repository import sha256_file

COMMITTED_HEADS_DIR = Path(__file__).parent / "weights"
HEADS_JSON = "heads.json"
CLASSIFIER_FILE = "classifier_head.safetensors"
MLM_FILE = "mlm_head.safetensors"
CLASSIFIER_NAME = "wordnet-noun-category"  # the assembled checkpoint directories' names
FILL_MASK_NAME = "wordnet-fill-mask"

# Copied from the base checkpoint: tokenizer and the sentence-transformers configs (embedding defaults).
BASE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)
SAFETENSORS_METADATA = {"format": "pt"}


class HeadsError(ExportError):
    """Missing or altered head files."""


def save_heads(
    directory: Path,
    classifier_state: dict[str, torch.Tensor],
    mlm_state: dict[str, torch.Tensor],
    record: dict,
) -> Path:
    """Writes both head files and heads.json (record + checksums); returns heads.json's path."""
    directory.mkdir(parents=True, exist_ok=True)
    save_file(classifier_state, str(directory / CLASSIFIER_FILE), metadata=SAFETENSORS_METADATA)
    save_file(mlm_state, str(directory / MLM_FILE), metadata=SAFETENSORS_METADATA)
    record = dict(record)
    record["files"] = {
        name: {"sha256": sha256_file(directory / name), "size_bytes": (directory / name).stat().st_size}
        for name in (CLASSIFIER_FILE, MLM_FILE)
    }
    path = directory / HEADS_JSON
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def read_heads_record(directory: Path = COMMITTED_HEADS_DIR) -> dict:
    path = Path(directory) / HEADS_JSON
    if not path.is_file():
        raise HeadsError(f"{path} not found: run `bertserve train-heads --out DIR`")
    return json.loads(path.read_text())


def verify_heads(directory: Path = COMMITTED_HEADS_DIR) -> dict:
    """Checks every head file against heads.json's sha256; returns the record."""
    record = read_heads_record(directory)
    for name, expected in record["files"].items():
        path = Path(directory) / name
        if not path.is_file():
            raise HeadsError(f"{path} is missing")
        actual = sha256_file(path)
        if actual != expected["sha256"]:
            raise HeadsError(f"{path}: sha256 {actual} differs from heads.json's {expected['sha256']}")
    return record


def _base_encoder_state(base_dir: Path) -> dict[str, torch.Tensor]:
    """The base checkpoint's encoder (embeddings + layers), keys without `bert.`, pooler and buffers left out."""
    state = load_file(str(base_dir / "model.safetensors"))
    state = {k.removeprefix("bert."): v for k, v in state.items()}
    return {
        k: v
        for k, v in state.items()
        if k.startswith(("embeddings.", "encoder.")) and "position_ids" not in k
    }


def write_checkpoint_directory(
    base_dir: Path, out_dir: Path, config: dict, state: dict[str, torch.Tensor], card: str
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(state, str(out_dir / "model.safetensors"), metadata=SAFETENSORS_METADATA)
    for name in BASE_FILES:
        if (base_dir / name).is_file():
            (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(base_dir / name, out_dir / name)
    (out_dir / "README.md").write_text(card)
    return out_dir


def _base_config(base_dir: Path) -> dict:
    config = json.loads((base_dir / "config.json").read_text())
    for key in ("_name_or_path", "transformers_version", "gradient_checkpointing", "use_cache"):
        config.pop(key, None)
    return config


def assemble_classifier(base_dir: Path, heads_dir: Path, out_dir: Path) -> Path:
    base_dir, heads_dir = Path(base_dir), Path(heads_dir)
    record = verify_heads(heads_dir)
    labels: list[str] = record["classifier"]["labels"]
    config = _base_config(base_dir) | {
        "architectures": ["BertForSequenceClassification"],
        "id2label": {str(i): label for i, label in enumerate(labels)},
        "label2id": {label: i for i, label in enumerate(labels)},
        "problem_type": "single_label_classification",
    }
    state = {f"bert.{k}": v for k, v in _base_encoder_state(base_dir).items()}
    state |= load_file(str(heads_dir / CLASSIFIER_FILE))
    figures = record["classifier"]["held_out"]
    card = (
        f"# {CLASSIFIER_NAME}\n\nWordNet 3.0 noun lexicographer category ({len(labels)} labels) of an English "
        "definition.\nEncoder: all-MiniLM-L6-v2, frozen; pooler + classifier trained by `bertserve "
        f"train-heads`.\nHeld-out accuracy: {figures['accuracy']:.4f} on {figures['examples']} synsets.\n"
    )
    return write_checkpoint_directory(base_dir, out_dir, config, state, card)


def assemble_fill_mask(base_dir: Path, heads_dir: Path, out_dir: Path) -> Path:
    base_dir, heads_dir = Path(base_dir), Path(heads_dir)
    record = verify_heads(heads_dir)
    config = _base_config(base_dir) | {"architectures": ["BertForMaskedLM"], "tie_word_embeddings": True}
    state = {f"bert.{k}": v for k, v in _base_encoder_state(base_dir).items()}
    state |= load_file(str(heads_dir / MLM_FILE))
    figures = record["fill_mask"]["held_out"]
    card = (
        f"# {FILL_MASK_NAME}\n\nMasked-token prediction. Encoder: all-MiniLM-L6-v2, frozen; MLM head "
        "(transform + bias, decoder tied to the word embeddings) trained by `bertserve train-heads` on "
        f"WordNet glosses.\nHeld-out masked-token accuracy: top-1 {figures['top1']:.4f}, top-5 "
        f"{figures['top5']:.4f} on {figures['masks']} masks.\n"
    )
    return write_checkpoint_directory(base_dir, out_dir, config, state, card)


def assemble_checkpoints(
    base_dir: Path, out_dir: Path, heads_dir: Path = COMMITTED_HEADS_DIR
) -> dict[str, Path]:
    """Both checkpoint directories under out_dir, named CLASSIFIER_NAME and FILL_MASK_NAME."""
    out_dir = Path(out_dir)
    return {
        CLASSIFIER_NAME: assemble_classifier(base_dir, heads_dir, out_dir / CLASSIFIER_NAME),
        FILL_MASK_NAME: assemble_fill_mask(base_dir, heads_dir, out_dir / FILL_MASK_NAME),
    }
