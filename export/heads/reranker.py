"""The default reranker's committed weights (weights/reranker.safetensors: the tensors `bertserve
train-reranker` trained, float16, with reranker.json: sha256, recipe, held-out figures) and the checkpoint
assembled from them: all-MiniLM-L6-v2's weights + those tensors, as a sentence-transformers CrossEncoder
(BertForSequenceClassification, one label, sigmoid), in the layout sentence-transformers 6 saves.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bertserve.export.heads.assemble import (
    COMMITTED_HEADS_DIR,
    SAFETENSORS_METADATA,
    HeadsError,
    _base_config,
    _base_encoder_state,
)
from bertserve.repository import CosineFusion, sha256_file

RERANKER_NAME = "wordnet-reranker"
WEIGHTS_FILE = "reranker.safetensors"
RECORD_FILE = "reranker.json"
LABEL = "relevance"
MAX_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
# sentence-transformers 6's CrossEncoder layout: one Transformer module at the root, scores = activation(logits).
ST_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"}
]
ST_MODULE_CONFIG = {
    "transformer_task": "sequence-classification",
    "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
    "module_output_name": "scores",
    "max_seq_length": MAX_LENGTH,
}
ST_MODEL_CONFIG = {
    "model_type": "CrossEncoder",
    "activation_fn": "torch.nn.modules.activation.Sigmoid",
    "default_prompt_name": None,
    "prompts": {},
}


def save_weights(directory: Path, state: dict[str, torch.Tensor], record: dict) -> Path:
    """Writes reranker.safetensors and reranker.json (record + the file's sha256 and size)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(state, str(directory / WEIGHTS_FILE), metadata=SAFETENSORS_METADATA)
    path = directory / WEIGHTS_FILE
    record = record | {
        "files": {WEIGHTS_FILE: {"sha256": sha256_file(path), "size_bytes": path.stat().st_size}}
    }
    (directory / RECORD_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return directory / RECORD_FILE


def rewrite_record(directory: Path, record: dict) -> None:
    """reranker.json replaced by `record`, keeping the checked weights file's entry."""
    files = verify_weights(directory)["files"]
    text = json.dumps(record | {"files": files}, indent=2, sort_keys=True) + "\n"
    (Path(directory) / RECORD_FILE).write_text(text)


def verify_weights(directory: Path = COMMITTED_HEADS_DIR) -> dict:
    """reranker.json, after checking reranker.safetensors against its sha256."""
    directory = Path(directory)
    if not (directory / RECORD_FILE).is_file():
        raise HeadsError(f"{directory / RECORD_FILE} not found: run `bertserve train-reranker --out DIR`")
    record = json.loads((directory / RECORD_FILE).read_text())
    expected = record["files"][WEIGHTS_FILE]["sha256"]
    if not (directory / WEIGHTS_FILE).is_file():
        raise HeadsError(f"{directory / WEIGHTS_FILE} is missing")
    if (actual := sha256_file(directory / WEIGHTS_FILE)) != expected:
        raise HeadsError(
            f"{directory / WEIGHTS_FILE}: sha256 {actual} differs from {RECORD_FILE}'s {expected}"
        )
    return record


def served_figures(record: dict) -> dict:
    """The held-out figures of the score the server gives: the fused one when the record has a fusion."""
    if "fusion" in record:
        return record["fusion"]["held_out"]["fused"]
    return record["variants"][str(record["chosen_layers"])]


def fusion_of(record: dict) -> CosineFusion | None:
    """The manifest's cosine fusion the record fitted, if any."""
    if "fusion" not in record:
        return None
    return CosineFusion(**{k: record["fusion"][k] for k in CosineFusion.model_fields})


def beats_baselines(record: dict) -> str | None:
    """None when the served score's held-out MRR@10 and nDCG@10 beat BM25's and the cosine's; else why not."""
    chosen = served_figures(record)
    for name, figures in record["baselines"].items():
        for metric in ("mrr@10", "ndcg@10"):
            if not chosen[metric] > figures[metric]:
                return f"held-out {metric} {chosen[metric]:.4f} is not above {name}'s {figures[metric]:.4f}"
    return None


def assemble_reranker(base_dir: Path, weights_dir: Path, out_dir: Path) -> Path:
    """OUT: a CrossEncoder checkpoint directory = the base encoder + the trained tensors (float32)."""
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    record = verify_weights(weights_dir)
    trained = {k: v.float() for k, v in load_file(str(Path(weights_dir) / WEIGHTS_FILE)).items()}
    state = {f"bert.{k}": v for k, v in _base_encoder_state(base_dir).items()} | trained
    if missing := {"classifier.weight", "classifier.bias", "bert.pooler.dense.weight"} - set(state):
        raise HeadsError(f"{weights_dir / WEIGHTS_FILE} lacks {sorted(missing)}")
    config = _base_config(base_dir) | {
        "architectures": ["BertForSequenceClassification"],
        "id2label": {"0": LABEL},
        "label2id": {LABEL: 0},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(state, str(out_dir / "model.safetensors"), metadata=SAFETENSORS_METADATA)
    for name in TOKENIZER_FILES:
        if (base_dir / name).is_file():
            shutil.copyfile(base_dir / name, out_dir / name)
    for name, content in (
        ("modules.json", ST_MODULES),
        ("sentence_bert_config.json", ST_MODULE_CONFIG),
        ("config_sentence_transformers.json", ST_MODEL_CONFIG),
    ):
        (out_dir / name).write_text(json.dumps(content, indent=2) + "\n")
    write_card(out_dir, record)
    return out_dir


def write_card(out_dir: Path, record: dict) -> None:
    """The checkpoint's README.md: what it is and its recorded held-out figures."""
    (Path(out_dir) / "README.md").write_text(_card(record))


def _card(record: dict) -> str:
    chosen = served_figures(record)
    base = record["baselines"]
    fused = (
        f"bertserve's score adds {record['fusion']['embedding_model']}'s cosine of the pair (its manifest's "
        "fusion); the figures below are that score's, the checkpoint alone gives the logit.\n"
        if "fusion" in record
        else ""
    )
    return (
        f"# {RERANKER_NAME}\n\nA cross-encoder reranker (query, document) -> relevance, sigmoid of one logit.\n"
        + fused
        + f"all-MiniLM-L6-v2 with its top {record['chosen_layers']} layers, pooler and classifier trained by "
        "`bertserve train-reranker` on WordNet 3.0 nouns (query: a sense's example or lemmas; documents: "
        "definitions).\nHeld-out MRR@10 "
        f"{chosen['mrr@10']:.4f} (BM25 {base['bm25']['mrr@10']:.4f}, MiniLM cosine {base['cosine']['mrr@10']:.4f}) "
        f"on {record['data']['test']['lists']} queries of {record['data']['test']['candidates']} candidates.\n"
    )
