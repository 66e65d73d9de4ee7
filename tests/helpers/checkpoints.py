"""Small random Hugging Face BERT checkpoints, made by `transformers` itself, for tests.

`make_checkpoint(directory, kind)` writes config.json, the weights (safetensors by default, or
pytorch_model.bin), vocab.txt, tokenizer.json and tokenizer_config.json. Biases and LayerNorm weights
are randomized: transformers initializes them to 0 and 1, which would hide bias and LayerNorm bugs.
Kinds: "BertModel", "BertForMaskedLM", "BertForSequenceClassification".
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
KINDS = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification")
# Odd sizes on purpose: hidden 48 split into 3 heads of 16, a vocabulary of 777.
TINY = dict(
    vocab_size=777,
    hidden_size=48,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=80,
    max_position_embeddings=72,
    type_vocab_size=2,
)


def vocabulary(size: int) -> list[str]:
    """Special tokens, single letters and digits, their '##' continuations, then filler words."""
    pieces = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'-")
    words = SPECIAL_TOKENS + pieces + ["##" + p for p in pieces]
    words += ["the", "a", "is", "of", "and", "to", "in", "cat", "dog", "sat", "on", "mat", "paris", "capital"]
    words += [f"word{i}" for i in range(size - len(words))]
    if len(words) != size:
        raise ValueError(f"vocab_size {size} is too small for the test vocabulary")
    return words


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    from tokenizers.implementations import BertWordPieceTokenizer

    vocab_file = directory / "vocab.txt"
    vocab_file.write_text("\n".join(vocabulary(vocab_size)) + "\n")
    BertWordPieceTokenizer(str(vocab_file), lowercase=True).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"do_lower_case": True, "model_max_length": 512})
    )


def randomize_biases_and_norms(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
            elif "LayerNorm.weight" in name:
                parameter.copy_(1.0 + torch.randn(parameter.shape, generator=generator) * 0.2)


def copy_encoder(model: torch.nn.Module, base_dir: Path) -> None:
    """Embeddings and layers of the BertModel checkpoint in base_dir into model (its pooler and head kept)."""
    from safetensors.torch import load_file

    state = {
        k: v for k, v in load_file(str(base_dir / "model.safetensors")).items() if not k.startswith("pooler.")
    }
    bert = model if type(model).__name__ == "BertModel" else model.bert
    missing, unexpected = bert.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("pooler.") for k in missing), (missing, unexpected)


def write_legacy_bin(model: torch.nn.Module, directory: Path) -> None:
    """Replaces model.safetensors by a pytorch_model.bin holding the full state dict, the tied decoder
    included, plus the `embeddings.position_ids` buffer that old checkpoints carry."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    prefix = "" if type(model).__name__ == "BertModel" else "bert."
    state[prefix + "embeddings.position_ids"] = torch.arange(model.config.max_position_embeddings)[None, :]
    if type(model).__name__ == "BertForMaskedLM":
        state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"].clone()
        state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].clone()
    torch.save(state, directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()


def make_checkpoint(
    directory: Path,
    kind: str = "BertModel",
    *,
    seed: int = 0,
    safetensors: bool = True,
    num_labels: int = 3,
    tokenizer: bool = True,
    encoder_from: Path | None = None,
    **config_overrides,
) -> Path:
    """Writes a random checkpoint of `kind` into directory (created) and returns it. `encoder_from`: a
    BertModel checkpoint whose embeddings and layers this one takes (its head, and pooler, stay its own),
    as a head trained on a frozen encoder."""
    import transformers

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sizes = {**TINY, **config_overrides}
    extra = {}
    if kind == "BertForSequenceClassification":
        extra["id2label"] = {i: f"label_{i}" for i in range(num_labels)}
        extra["label2id"] = {v: k for k, v in extra["id2label"].items()}
    config = transformers.BertConfig(**sizes, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, kind)(config).eval()
    randomize_biases_and_norms(model, seed)
    if encoder_from is not None:
        copy_encoder(model, Path(encoder_from))
    model.save_pretrained(directory)
    if (
        not safetensors
    ):  # the older format: pytorch_model.bin with every key spelled out, as BERT's first releases
        write_legacy_bin(model, directory)
    if tokenizer:
        write_tokenizer(directory, sizes["vocab_size"])
    return directory


def load_reference(directory: Path) -> torch.nn.Module:
    """The same checkpoint loaded by transformers (eager attention), for parity checks."""
    import transformers

    config = json.loads((Path(directory) / "config.json").read_text())
    cls = getattr(transformers, config["architectures"][0])
    return cls.from_pretrained(directory, attn_implementation="eager").eval()


def export_all(repo: Path, exports: list[tuple[str, Path, list[str]]]) -> Path:
    """Each (name, checkpoint directory, extra flags) exported into `repo` as version 1 through the
    `bertserve export` command, as a user would; returns `repo`."""
    from bertserve.cli import main

    for name, checkpoint, extra in exports:
        argv = [
            "export",
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(repo),
            "--name",
            name,
            "--version",
            "1",
        ]
        assert main([*argv, *extra]) == 0, f"bertserve export of {name} failed"
    return Path(repo)
