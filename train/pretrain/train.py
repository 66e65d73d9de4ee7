"""The pretraining loop: masked batches, AdamW with linear warmup and decay, resumable state.

Deterministic: everything random is derived from (seed, step): the epoch's batch order from (seed, epoch),
the masking of step s from (seed, s), dropout from torch.manual_seed(seed, s). So a run resumed from its
state file at step k continues exactly as the uninterrupted run would have (same machine type, same thread
count, same library versions). The state file holds the trained tensors, the optimizer and schedule, the
step and the recipe; a resume with a different recipe is refused.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from bertserve.export.errors import ExportError
from bertserve.export.model import BertForMaskedLM
from bertserve.train.pretrain.corpus import Tokenized, batches_of_epoch, batches_per_epoch
from bertserve.train.pretrain.masking import IGNORE, MaskingScheme, mask_texts
from bertserve.train.pretrain.model_setup import LayerRange, set_modes, trainable_names

STATE_FILE = "resume.pt"


@dataclass(frozen=True)
class Recipe:
    """What determines the result: a resume must use the same."""

    steps: int
    batch_size: int = 64
    learning_rate: float = 3e-4
    warmup_steps: int = 100
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0
    layers: tuple[int, int] = (0, 0)  # trained encoder layers, half-open
    train_embeddings: bool = False
    masking: MaskingScheme = field(default_factory=MaskingScheme)
    threads: int = 1


@dataclass
class RunResult:
    step: int  # steps done in total
    finished: bool  # step == recipe.steps
    losses: list[
        float
    ]  # per step since step 0 (kept in the state file), cross-entropy at the chosen positions
    tokens: int  # tokens (no padding) seen by this run
    seconds: float


class ResumeMismatch(ExportError):
    """The state file was written by a different recipe."""


@contextmanager
def deterministic_torch(threads: int) -> Iterator[None]:
    """Fixed thread count and deterministic kernels, restored afterwards (the process may go on with other work)."""
    saved = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1])


def linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def build_optimizer(model: BertForMaskedLM, names: list[str], recipe: Recipe):
    parameters = dict(model.named_parameters())
    no_decay = [parameters[n] for n in names if n.endswith(".bias") or "LayerNorm" in n]
    decay = [parameters[n] for n in names if not (n.endswith(".bias") or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.learning_rate,
        betas=(0.9, 0.999),
        eps=1e-6,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, linear_schedule(recipe.warmup_steps, recipe.steps)
    )
    return optimizer, schedule


def pad_batch(arrays: list[np.ndarray], value: int) -> torch.Tensor:
    out = np.full((len(arrays), max(len(a) for a in arrays)), value, dtype=np.int64)
    for row, a in enumerate(arrays):
        out[row, : len(a)] = a
    return torch.from_numpy(out)


def mlm_loss(
    model: BertForMaskedLM, layers: LayerRange, train_embeddings: bool, input_ids, attention_mask, labels
):
    """Cross-entropy at the chosen positions; the frozen layers below the trained range run without autograd."""
    bert = model.bert
    with torch.set_grad_enabled(train_embeddings):
        x = bert.embeddings(input_ids, torch.zeros_like(input_ids))  # (B, T, C)
    mask = attention_mask[:, None, None, :].to(x.dtype)  # (B, 1, 1, T)
    additive_mask = (1.0 - mask) * torch.finfo(x.dtype).min
    for index, block in enumerate(bert.encoder.layer):
        with torch.set_grad_enabled(train_embeddings or index >= layers.start):
            x, _ = block(x, additive_mask)
    chosen = labels != IGNORE  # (B, T)
    logits = model.cls(x[chosen])  # (M, V): the vocabulary projection only where a token is predicted
    return F.cross_entropy(logits, labels[chosen])


def _save_state(path: Path, model, names, optimizer, schedule, step: int, recipe: Recipe, losses) -> None:
    parameters = dict(model.named_parameters())
    state = {
        "step": step,
        "recipe": asdict(recipe),
        "trained": {n: parameters[n].detach().clone() for n in names},
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "losses": list(losses),
    }
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    torch.save(state, partial)
    partial.replace(path)  # atomic: a run killed while saving keeps the previous state


def _load_state(path: Path, model, names, optimizer, schedule, recipe: Recipe) -> tuple[int, list[float]]:
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state["recipe"] != asdict(recipe):
        raise ResumeMismatch(
            f"{path} was written with another recipe: {state['recipe']} (this run: {asdict(recipe)})"
        )
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for n in names:
            parameters[n].copy_(state["trained"][n])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    return int(state["step"]), list(state["losses"])


def train(
    model: BertForMaskedLM,
    data: Tokenized,
    recipe: Recipe,
    mask_token_id: int,
    random_token_ids: np.ndarray,
    state_dir: Path,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    deadline: float | None = None,
    save_every: int = 200,
    log: Callable[[str], None] = print,
) -> RunResult:
    """Trains in place up to recipe.steps (or stop_after steps in total, or time.time() >= deadline), saving
    the state every save_every steps and when it stops. Call it inside `deterministic_torch(recipe.threads)`
    (pipeline.pretrain does, around the evaluation too)."""
    if len(data) == 0:
        raise ExportError("no training texts")
    layers = LayerRange(*recipe.layers)
    names = trainable_names(model, layers, recipe.train_embeddings)
    optimizer, schedule = build_optimizer(model, names, recipe)
    state_path = Path(state_dir) / STATE_FILE
    step, losses = 0, []
    if resume and state_path.is_file():
        step, losses = _load_state(state_path, model, names, optimizer, schedule, recipe)
        log(f"-> resumed from {state_path} at step {step}")
    last = recipe.steps if stop_after is None else min(recipe.steps, stop_after)
    lengths = np.array([len(ids) for ids in data.ids])
    per_epoch = batches_per_epoch(len(data), recipe.batch_size)
    epoch_cache: dict[int, list[np.ndarray]] = {}
    tokens, started = 0, time.perf_counter()
    set_modes(model, layers, recipe.train_embeddings)
    interactive = sys.stderr.isatty()
    bar = tqdm(
        total=last,
        initial=step,
        unit="step",
        dynamic_ncols=True,
        mininterval=0.5 if interactive else 60,
        file=sys.stderr,
        disable=None if interactive else False,
    )
    try:
        while step < last and (deadline is None or time.time() < deadline):
            epoch, index = divmod(step, per_epoch)
            if epoch not in epoch_cache:
                epoch_cache = {epoch: batches_of_epoch(lengths, recipe.batch_size, recipe.seed, epoch)}
            batch = epoch_cache[epoch][index]
            rng = np.random.default_rng([recipe.seed, 1, step])
            inputs, labels = mask_texts(
                [data.ids[i] for i in batch],
                [data.word_ids[i] for i in batch],
                recipe.masking,
                rng,
                mask_token_id,
                random_token_ids,
            )
            input_ids = pad_batch(inputs, 0)
            attention_mask = pad_batch([np.ones(len(a), dtype=np.int64) for a in inputs], 0)
            label_ids = pad_batch(labels, IGNORE)
            torch.manual_seed(recipe.seed * 1_000_003 + step)  # dropout
            if (label_ids != IGNORE).any():
                loss = mlm_loss(model, layers, recipe.train_embeddings, input_ids, attention_mask, label_ids)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(
                    [p for p in model.parameters() if p.requires_grad], recipe.max_grad_norm
                )
                optimizer.step()
                losses.append(loss.item())
            else:  # nothing chosen in the whole batch (tiny batches only): the step still counts
                losses.append(math.nan)
            schedule.step()
            step += 1
            tokens += int(attention_mask.sum())
            seconds = time.perf_counter() - started
            recent = [v for v in losses[-50:] if not math.isnan(v)]
            bar.set_postfix(
                loss=f"{np.mean(recent):.3f}" if recent else "-",
                tok_s=f"{tokens / seconds:.0f}",
                lr=f"{schedule.get_last_lr()[0]:.2e}",
                refresh=False,
            )
            bar.update(1)
            if save_every and step % save_every == 0:
                _save_state(state_path, model, names, optimizer, schedule, step, recipe, losses)
    finally:
        bar.close()
    _save_state(state_path, model, names, optimizer, schedule, step, recipe, losses)
    model.eval()
    return RunResult(step, step >= recipe.steps, losses, tokens, time.perf_counter() - started)
