"""The model pretraining starts from, and which of its parameters train.

Starting points: a checkpoint directory (BertForMaskedLM as it is; a BertModel gets an MLM head, fresh or
from a head file of `cls.predictions.*` tensors), or `from_scratch`: the directory's config with random
weights (Hugging Face's initialization: normal(0, initializer_range), biases 0, LayerNorm 1 and 0).

Trained: the encoder layers in `layers` (a half-open range), the MLM head's transform and bias, and the
embeddings only when asked (the decoder is tied to the word embeddings, so it trains with them). Everything
else is frozen: no gradient, eval mode (no dropout), left bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from bertserve.export.checkpoint import BASE, MASKED_LM, load_checkpoint
from bertserve.export.errors import CheckpointError
from bertserve.export.model import BertConfig, BertForMaskedLM

INITIALIZER_RANGE = 0.02


@dataclass(frozen=True)
class LayerRange:
    start: int
    stop: int  # exclusive

    @classmethod
    def parse(cls, text: str, num_layers: int) -> LayerRange:
        """'4:6', '4:' (to the top), ':2', 'all' -> a checked range of [0, num_layers)."""
        if text == "all":
            return cls(0, num_layers)
        first, sep, last = text.partition(":")
        if not sep:
            raise ValueError(f"--train-layers {text!r}: expected START:STOP (e.g. 4:6), START: or all")
        start, stop = int(first or 0), int(last) if last else num_layers
        if not 0 <= start < stop <= num_layers:
            raise ValueError(
                f"--train-layers {text!r}: need 0 <= START < STOP <= {num_layers} (the model's layers)"
            )
        return cls(start, stop)

    def __contains__(self, index: int) -> bool:
        return self.start <= index < self.stop


def hf_initialize(module: nn.Module, std: float = INITIALIZER_RANGE) -> None:
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, std)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.Embedding):
                m.weight.normal_(0.0, std)
                if m.padding_idx is not None:
                    m.weight[m.padding_idx].zero_()
            elif isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()


def _tie(model: BertForMaskedLM) -> None:
    model.cls.predictions.decoder.weight = model.bert.embeddings.word_embeddings.weight


def load_start_model(
    checkpoint_dir: Path, head_file: Path | None = None, from_scratch: bool = False, seed: int = 0
) -> BertForMaskedLM:
    """The model before training (float32, eval mode); its decoder tied to the word embeddings."""
    if from_scratch:
        from bertserve.export.checkpoint import read_config

        config = read_config(checkpoint_dir)
        config.tie_word_embeddings = True
        torch.manual_seed(seed)
        model = BertForMaskedLM(config)
        hf_initialize(model)
        _tie(model)
        return model.eval()
    checkpoint = load_checkpoint(checkpoint_dir)
    if checkpoint.architecture not in (BASE, MASKED_LM):
        raise CheckpointError(
            f"{checkpoint_dir}: pretraining starts from BertModel or BertForMaskedLM, not {checkpoint.architecture}"
        )
    config: BertConfig = checkpoint.config
    config.tie_word_embeddings = True
    if checkpoint.architecture == MASKED_LM and head_file is None:
        model = checkpoint.model
        _tie(model)
        return model.eval()
    model = BertForMaskedLM(config)
    encoder_state = {k: v for k, v in checkpoint.encoder.state_dict().items() if not k.startswith("pooler.")}
    model.bert.load_state_dict(encoder_state, strict=True)
    torch.manual_seed(seed)
    hf_initialize(model.cls.predictions.transform)
    with torch.no_grad():
        model.cls.predictions.bias.zero_()
    _tie(model)
    if head_file is not None:
        head = load_file(str(head_file))
        expected = {
            f"cls.predictions.{k}" for k in model.cls.predictions.state_dict() if not k.startswith("decoder.")
        }
        if set(head) != expected:
            raise CheckpointError(
                f"{head_file}: expected the tensors {sorted(expected)}, found {sorted(head)}"
            )
        model.load_state_dict(head, strict=False)
    return model.eval()


def trainable_names(model: BertForMaskedLM, layers: LayerRange, train_embeddings: bool) -> list[str]:
    """Parameter names (state-dict names, the tied decoder left out) that train; sets requires_grad."""
    names = []
    for name, parameter in model.named_parameters():  # the tied decoder weight is listed once, as embedding
        trains = name.startswith("cls.predictions.") or (
            train_embeddings and name.startswith("bert.embeddings.")
        )
        if name.startswith("bert.encoder.layer."):
            trains = int(name.split(".")[3]) in layers
        parameter.requires_grad_(trains)
        if trains:
            names.append(name)
    return names


def set_modes(model: BertForMaskedLM, layers: LayerRange, train_embeddings: bool) -> None:
    """Trained modules in train mode (dropout on), frozen ones in eval mode."""
    model.train()
    model.bert.embeddings.train(train_embeddings)
    for index, block in enumerate(model.bert.encoder.layer):
        block.train(index in layers)
