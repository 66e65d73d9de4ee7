"""`bertserve pretrain` end to end: start model, corpus, training, held-out evaluation, output files."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from bertserve import __version__
from bertserve.export.checkpoint import find_weights_file
from bertserve.export.errors import ExportError
from bertserve.export.pretrain import output
from bertserve.export.tokenizer_files import load_tokenizer, special_tokens
from bertserve.manifest import sha256_file
from bertserve.train.pretrain import corpus, evaluate
from bertserve.train.pretrain.model_setup import LayerRange, load_start_model, trainable_names
from bertserve.train.pretrain.train import Recipe, deterministic_torch, train


@dataclass(frozen=True)
class Source:
    """Where the model and the text come from."""

    checkpoint_dir: Path
    name: str  # recorded as the base model's name
    head_file: Path | None = None  # MLM head to start from when the checkpoint is a BertModel
    from_scratch: bool = False
    text_files: tuple[Path, ...] = ()
    wordnet: bool = False
    held_out_percent: int = 5  # text files only; WordNet uses export/heads' split (10 %)


def _random_token_ids(tokenizer, vocab_size: int) -> np.ndarray:
    special = {token.content for token in tokenizer.get_added_tokens_decoder().values() if token.special}
    special_ids = {tokenizer.token_to_id(t) for t in special}
    return np.array([i for i in range(vocab_size) if i not in special_ids], dtype=np.int64)


def loss_curve(losses: list[float], points: int = 20) -> list[list[float]]:
    """[last step of the window, mean loss] over up to `points` equal windows of the steps."""
    window = max(1, -(-len(losses) // points))
    curve = []
    for start in range(0, len(losses), window):
        part = [v for v in losses[start : start + window] if v == v]  # NaN: a step with nothing chosen
        if part:
            curve.append([start + len(losses[start : start + window]), round(float(np.mean(part)), 4)])
    return curve


def texts(source: Source) -> tuple[list[str], list[str]]:
    train_texts, test_texts = [], []
    if source.wordnet:
        train_texts, test_texts = corpus.read_wordnet()
    if source.text_files:
        more_train, more_test = corpus.read_text_files(source.text_files, source.held_out_percent)
        train_texts, test_texts = train_texts + more_train, test_texts + more_test
    if not train_texts:
        raise ExportError("no training text: give --text FILE and/or --wordnet")
    return train_texts, test_texts


def data_record(source: Source) -> dict:
    """What the text was (pretrain.json's "data", without the counts)."""
    return {
        "wordnet": source.wordnet,
        "text_files": [{"name": p.name, "sha256": sha256_file(p)} for p in source.text_files],
    }


def held_out_masks(source: Source, tokenizer, mask_id: int, test_texts: list[str]):
    """The masked held-out texts and their targets: WordNet's are export/heads' very masks."""
    if source.wordnet and not source.text_files:
        return evaluate.wordnet_held_out(tokenizer, mask_id)
    return evaluate.masked_held_out(tokenizer, test_texts, mask_id)


def pretrain(source: Source, recipe: Recipe, out_dir: Path, **options) -> dict:
    """Trains and writes OUT/checkpoint/ (full BertForMaskedLM checkpoint), OUT/trained.safetensors and
    OUT/pretrain.json; OUT/resume.pt lets a later call with resume=True continue. Returns the record.
    Options: resume, stop_after, deadline, save_every, evaluate_initial, log (see _pretrain)."""
    with deterministic_torch(recipe.threads):
        return _pretrain(source, recipe, out_dir, **options)


def _pretrain(
    source: Source,
    recipe: Recipe,
    out_dir: Path,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    deadline: float | None = None,
    save_every: int = 200,
    evaluate_initial: bool = False,
    log: Callable[[str], None] = print,
) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model = load_start_model(source.checkpoint_dir, source.head_file, source.from_scratch, recipe.seed)
    LayerRange(*recipe.layers)  # checked by the caller; fails loudly here otherwise
    tokenizer = load_tokenizer(source.checkpoint_dir)
    mask_id = special_tokens(source.checkpoint_dir, tokenizer).mask_token_id
    if mask_id is None:
        raise ExportError(f"{source.checkpoint_dir}: the tokenizer has no mask token")
    train_texts, test_texts = texts(source)
    data = corpus.tokenize(tokenizer, train_texts)
    log(f"-> {len(data)} training texts ({data.token_count} tokens), {len(test_texts)} held out")
    held_out = held_out_masks(source, tokenizer, mask_id, test_texts)
    record_eval = {}
    if evaluate_initial and test_texts:
        record_eval["before"] = evaluate.topk(model, *held_out, mask_id)
        log(
            f"-> held out before: top-1 {record_eval['before']['top1']:.4f}, top-5 {record_eval['before']['top5']:.4f}"
        )
    result = train(
        model,
        data,
        recipe,
        mask_id,
        _random_token_ids(tokenizer, model.config.vocab_size),
        out_dir,
        resume=resume,
        stop_after=stop_after,
        deadline=deadline,
        save_every=save_every,
        log=log,
    )
    log(
        f"-> {result.step}/{recipe.steps} steps ({'finished' if result.finished else 'stopped'}), "
        f"{result.tokens / max(result.seconds, 1e-9):.0f} tokens/s"
    )
    if test_texts:
        record_eval["after"] = evaluate.topk(model, *held_out, mask_id)
        log(
            f"-> held out after: top-1 {record_eval['after']['top1']:.4f}, top-5 {record_eval['after']['top5']:.4f}"
        )
    names = trainable_names(model, LayerRange(*recipe.layers), recipe.train_embeddings)
    finite = [v for v in result.losses if v == v]
    shared = output.shared_with_base(model, names)
    record = {
        "tool": f"bertserve {__version__} pretrain",
        "base": {
            "name": source.name,
            "model_sha256": None
            if source.from_scratch
            else sha256_file(find_weights_file(source.checkpoint_dir)),
            "head_file_sha256": sha256_file(source.head_file) if source.head_file else None,
            "from_scratch": source.from_scratch,
        },
        "data": data_record(source)
        | {
            "train_texts": len(data),
            "train_tokens": data.token_count,
            "held_out_texts": len(test_texts),
        },
        "recipe": asdict(recipe),
        "trained_tensors": len(names),
        "trained_parameters": int(sum(dict(model.named_parameters())[n].numel() for n in names)),
        "shared_with_base": shared,
        "progress": {
            "steps_done": result.step,
            "finished": result.finished,
            "first_50_steps_loss": float(np.mean(finite[:50])) if finite else None,
            "last_50_steps_loss": float(np.mean(finite[-50:])) if finite else None,
            "loss_curve": loss_curve(result.losses),
            "tokens_per_second": round(result.tokens / max(result.seconds, 1e-9), 1),
            "train_seconds": round(result.seconds, 1),
        },
        "held_out": record_eval,
        "environment": {"torch": torch.__version__, "threads": recipe.threads, "machine": platform.machine()},
        "seconds_total": round(time.perf_counter() - started, 1),
    }
    after = record_eval.get("after")
    record["card"] = (
        f"# {source.name} + masked-LM pretraining\n\nTrained by `bertserve pretrain` ({result.step} steps): "
        f"encoder layers {recipe.layers[0]}..{recipe.layers[1] - 1}, MLM head"
        f"{', embeddings' if recipe.train_embeddings else ''}; unchanged from the base: {', '.join(shared) or 'nothing'}.\n"
        + (
            f"Held-out masked-token accuracy: top-1 {after['top1']:.4f}, top-5 {after['top5']:.4f} on {after['masks']} masks.\n"
            if after
            else ""
        )
    )
    output.write_checkpoint(model, source.checkpoint_dir, out_dir / output.CHECKPOINT_SUBDIR, record["card"])
    output.write_trained(model, names, out_dir, record)
    log(
        f"-> wrote {out_dir / output.CHECKPOINT_SUBDIR}, {out_dir / output.TRAINED_FILE}, {out_dir / output.RECORD_FILE}"
    )
    return record
