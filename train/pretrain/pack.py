"""Packing a chain of pretraining stages into the weights the repository commits.

Each `bertserve pretrain` stage starts from the previous stage's checkpoint (its pretrain.json records that
checkpoint's sha256), the first from the base model, or, when the chain continues an earlier pack
(`continues`), from that pack assembled onto the base (what `bertserve assemble-pretrained` writes, byte for
byte). `pack` checks the chain link by link, keeps the tensors of the last stage's checkpoint that differ
from the base (the trained layers and the MLM head), stores them in float16 by default (half the bytes: six
trained layers and the head take 21.7 MB), and measures the held-out figures again, on the last stage's
held-out text, with the packed tensors assembled onto the base: what `bertserve export` and the server will
run. The record lists every stage's recipe and figures and which modules the packed model still shares
with the base.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from bertserve import __version__
from bertserve.export.checkpoint import find_weights_file, read_weights
from bertserve.export.heads.assemble import SAFETENSORS_METADATA
from bertserve.export.pretrain import output
from bertserve.export.tokenizer_files import load_tokenizer, special_tokens
from bertserve.manifest import sha256_file
from bertserve.train.pretrain import evaluate
from bertserve.train.pretrain.model_setup import load_start_model
from bertserve.train.pretrain.pipeline import Source, data_record, held_out_masks, texts

STAGE_KEYS = ("base", "data", "recipe", "held_out", "progress", "trained_parameters", "environment")
PACKED_DTYPES = {"float16": torch.float16, "float32": torch.float32}


def _stage_record(stage_dir: Path) -> dict:
    record = json.loads((stage_dir / output.RECORD_FILE).read_text())
    if not record.get("progress", {}).get("finished"):
        raise output.PretrainedWeightsError(f"{stage_dir}: the stage did not finish its schedule")
    return record


def check_chain(base_dir: Path, stage_dirs: list[Path], start_sha256: str | None = None) -> list[dict]:
    """Every stage's record, once each started from the checkpoint before it; the first from the checkpoint
    whose weights file has `start_sha256` (default: the base's)."""
    if not stage_dirs:
        raise output.PretrainedWeightsError("no stages to pack")
    records, expected = [], start_sha256 or sha256_file(find_weights_file(base_dir))
    for index, stage_dir in enumerate(stage_dirs):
        record = _stage_record(stage_dir)
        if record["base"]["model_sha256"] != expected:
            start = "the continued pack, assembled" if start_sha256 else "the base"
            raise output.PretrainedWeightsError(
                f"{stage_dir} did not start from " + ("the previous stage's checkpoint" if index else start)
            )
        records.append({key: record[key] for key in STAGE_KEYS if key in record})
        expected = sha256_file(find_weights_file(stage_dir / output.CHECKPOINT_SUBDIR))
    return records


def changed_tensors(base_dir: Path, checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (Hugging Face names) that are not bit-identical to the base's."""
    base = output.encoder_state(read_weights(find_weights_file(base_dir)))
    final = read_weights(find_weights_file(checkpoint_dir))
    return {
        name: tensor
        for name, tensor in final.items()
        if (name.startswith("cls.predictions.") and not name.startswith("cls.predictions.decoder."))
        or (name in base and not torch.equal(base[name], tensor))
    }


def continued_pack(base_dir: Path, packed_dir: Path) -> tuple[dict, str]:
    """(record, sha256 of its assembled weights file) of an earlier pack on the same base: the checkpoint a
    continuing chain's first stage must have started from."""
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = output.assemble(base_dir, packed_dir, Path(scratch) / output.CHECKPOINT_SUBDIR)
        start_sha256 = sha256_file(find_weights_file(checkpoint))
    return json.loads((Path(packed_dir) / output.RECORD_FILE).read_text()), start_sha256


def pack(
    base_dir: Path,
    base_name: str,
    stage_dirs: list[Path],
    out_dir: Path,
    data: Source,
    dtype: str = "float16",
    log: Callable[[str], None] = print,
    continues: Path | None = None,
) -> dict:
    """Writes OUT/trained.safetensors and OUT/pretrain.json; returns the record. `data` names the text the
    last stage trained on (its held-out part is measured again); its checkpoint_dir is not used.
    `continues`: an earlier pack (on this base) whose assembled checkpoint the first stage started from; the
    record then lists that pack's stages before these, and `continues` says where the chain was packed."""
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    earlier, start_sha256 = continued_pack(base_dir, continues) if continues else ({}, None)
    stages = earlier.get("stages", []) + check_chain(base_dir, [Path(s) for s in stage_dirs], start_sha256)
    recorded = {k: stages[-1]["data"][k] for k in ("wordnet", "text_files")}
    if data_record(data) != recorded:
        raise output.PretrainedWeightsError(
            f"the held-out text must be the last stage's: it trained on {recorded}, not {data_record(data)}"
        )
    changed = changed_tensors(base_dir, Path(stage_dirs[-1]) / output.CHECKPOINT_SUBDIR)
    packed = {name: tensor.to(PACKED_DTYPES[dtype]).contiguous() for name, tensor in sorted(changed.items())}
    overflowed = [name for name, tensor in packed.items() if not torch.isfinite(tensor).all()]
    if overflowed:
        raise output.PretrainedWeightsError(f"{dtype} cannot hold {overflowed}: pack with --dtype float32")
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(packed, str(out_dir / output.TRAINED_FILE), metadata=SAFETENSORS_METADATA)
    num_layers = json.loads((base_dir / "config.json").read_text())["num_hidden_layers"]
    shared = output.shared_modules(list(packed), num_layers)
    record = {
        "tool": f"bertserve {__version__} pack-pretrained",
        "base": {"name": base_name, "model_sha256": sha256_file(find_weights_file(base_dir))},
        "dtype": dtype,
        "stages": stages,
        **({"continues": _continued_record(earlier, start_sha256)} if continues else {}),
        "trained_tensors": len(packed),
        "trained_parameters": int(sum(t.numel() for t in packed.values())),
        "shared_with_base": shared,
        "files": {output.TRAINED_FILE: output.file_entry(out_dir / output.TRAINED_FILE)},
    }
    record["held_out"] = {"after": _measure(base_dir, out_dir, record, data)}
    after = record["held_out"]["after"]
    log(f"-> packed ({dtype}): held out top-1 {after['top1']:.4f}, top-5 {after['top5']:.4f}")
    record["card"] = (
        f"# {base_name} + masked-LM pretraining\n\nTrained by `bertserve pretrain` in {len(stages)} stages "
        f"({sum(s['recipe']['steps'] for s in stages)} steps), packed in {dtype}; unchanged from the base: "
        f"{', '.join(shared) or 'nothing'}.\nHeld-out masked-token accuracy: top-1 {after['top1']:.4f}, "
        f"top-5 {after['top5']:.4f} on {after['masks']} masks.\n"
    )
    output.write_record(out_dir, record)
    return record


HEADS_SUMMARY_KEY = "fill_mask_pretraining"
RECIPE_SUMMARY = ("layers", "steps", "batch_size", "learning_rate", "warmup_steps", "seed")


def summarize_in_heads_record(heads_json: Path, weights_dir: Path, record: dict) -> None:
    """train-heads' heads.json gains (or has replaced) `fill_mask_pretraining`: the packed weights' sha256
    and held-out figures and every stage's recipe and figures, beside the WordNet head they started from.
    The whole record stays in WEIGHTS_DIR/pretrain.json (named relative to heads.json)."""
    heads_json = Path(heads_json)
    heads = json.loads(heads_json.read_text())
    heads[HEADS_SUMMARY_KEY] = {
        "record": os.path.relpath(Path(weights_dir) / output.RECORD_FILE, heads_json.parent),
        "trained_sha256": record["files"][output.TRAINED_FILE]["sha256"],
        "dtype": record["dtype"],
        "trained_parameters": record["trained_parameters"],
        "shared_with_base": record["shared_with_base"],
        "held_out": record["held_out"]["after"],
        "stages": [
            {key: stage["recipe"][key] for key in RECIPE_SUMMARY} | {"held_out": stage["held_out"]["after"]}
            for stage in record["stages"]
        ],
    }
    heads_json.write_text(json.dumps(heads, indent=2, sort_keys=True) + "\n")


def _continued_record(earlier: dict, start_sha256: str) -> dict:
    """Where the chain was packed and went on: after stage N, from the weights packed in DTYPE."""
    return {
        "after_stage": len(earlier["stages"]),
        "dtype": earlier["dtype"],
        "trained_sha256": earlier["files"][output.TRAINED_FILE]["sha256"],
        "assembled_model_sha256": start_sha256,
        "held_out": earlier["held_out"]["after"],
    }


def _measure(base_dir: Path, weights_dir: Path, record: dict, data: Source) -> dict:
    """Held-out top-1/top-5 of the base + packed tensors, assembled as `bertserve export` will see them."""
    output.write_record(weights_dir, record)
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = output.assemble(base_dir, weights_dir, Path(scratch) / output.CHECKPOINT_SUBDIR)
        model = load_start_model(checkpoint)
        tokenizer = load_tokenizer(checkpoint)
        mask_id = special_tokens(checkpoint, tokenizer).mask_token_id
        masked = held_out_masks(data, tokenizer, mask_id, texts(data)[1])
        return evaluate.topk(model, *masked, mask_id)
