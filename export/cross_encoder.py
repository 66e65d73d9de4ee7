"""Recognises a sentence-transformers CrossEncoder checkpoint and reads how its logits become scores.

Formats, as sentence-transformers writes them:
- 6.x: config_sentence_transformers.json with `"model_type": "CrossEncoder"` and `activation_fn`;
- 4.x-5.x: config.json's `sentence_transformers` object with `activation_fn`;
- earlier: config.json's `sbert_ce_default_activation_function` (written only when one was chosen).
The activation is looked up in that order (as sentence-transformers loads it); none named: sigmoid for one
label, identity otherwise (its default). Max length: sentence_bert_config.json's `max_seq_length`, else
tokenizer_config.json's `model_max_length`, kept within the position embeddings (as it caps it).
"""

from __future__ import annotations

from pathlib import Path

from bertserve.export.errors import CheckpointError
from bertserve.export.tokenizer_files import json_or_empty
from bertserve.repository import CrossEncoderSpec

ST_CONFIG = "config_sentence_transformers.json"
LEGACY_KEY = "sbert_ce_default_activation_function"
# the torch.nn classes sentence-transformers saves by their dotted path, and what the manifest calls them
ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity", "Softmax": "softmax"}


def _declared_activation(directory: Path, config: dict) -> tuple[bool, str | None]:
    """(is a CrossEncoder, the dotted path of its activation when it names one)."""
    st_config = json_or_empty(directory / ST_CONFIG)
    modern = st_config.get("model_type") == "CrossEncoder"
    nested = config.get("sentence_transformers")
    middle = isinstance(nested, dict) and "activation_fn" in nested
    legacy = LEGACY_KEY in config
    for present, value in (
        (modern, st_config.get("activation_fn")),
        (middle, nested.get("activation_fn") if middle else None),
        (legacy, config.get(LEGACY_KEY)),
    ):
        if present and value is not None:
            return True, value
    return modern or middle or legacy, None


def _activation_name(path: str, where: Path) -> str:
    module, _, name = path.rpartition(".") if isinstance(path, str) else ("", "", "")
    if (module + ".").startswith("torch.nn.") and name in ACTIVATIONS:
        return ACTIVATIONS[name]
    raise CheckpointError(
        f"{where}: cross-encoder activation {path!r} is not supported "
        f"(supported: torch.nn {', '.join(ACTIVATIONS)})"
    )


def _declared_max_length(directory: Path) -> int | None:
    for file, key in (
        ("sentence_bert_config.json", "max_seq_length"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        value = json_or_empty(directory / file).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 2:
            return value
    return None


def read_cross_encoder(directory: Path | str, num_labels: int, limit: int) -> CrossEncoderSpec | None:
    """The CrossEncoder spec of a checkpoint directory, or None when it is not a CrossEncoder's.
    `limit`: the longest sequence the model takes (its position embeddings, at most the export's cap)."""
    directory = Path(directory)
    config = json_or_empty(directory / "config.json")
    recognised, path = _declared_activation(directory, config)
    if not recognised:
        return None
    if path is None:
        activation = "sigmoid" if num_labels == 1 else "identity"
    else:
        activation = _activation_name(path, directory)
    declared = _declared_max_length(directory)
    return CrossEncoderSpec(activation=activation, max_length=min(declared, limit) if declared else None)
