"""What an embedding model declares beyond pooling: Matryoshka dimensions and prompts.

Read from config_sentence_transformers.json: `prompts` (name -> text prepended to an input),
`default_prompt_name` (must name one of them) and `matryoshka_dimensions` (bertserve's key: the smaller sizes
the model was trained to be cut to, each 1 <= d < hidden size). `bertserve export --dimensions` overrides the
latter. Bad values raise CheckpointError naming the file (or the flag) and the value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bertserve.export.errors import CheckpointError, ExportError
from bertserve.export.tokenizer_files import json_or_empty

ST_CONFIG = "config_sentence_transformers.json"
DIMENSIONS_KEY = "matryoshka_dimensions"
MAX_PROMPTS = 64  # names and texts are kept in the manifest and sent in every Info answer
MAX_PROMPT_CHARS = 4096
MAX_DIMENSIONS = 32  # each size adds two calibration ranges of its length to the manifest


@dataclass(frozen=True)
class EmbeddingOptions:
    dimensions: tuple[int, ...] = ()  # ascending, each below the hidden size
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None


def check_dimensions(values, hidden_size: int, where: str) -> tuple[int, ...]:
    """`values` as ascending distinct sizes 1 <= d < hidden_size; raises CheckpointError naming `where`."""
    if not isinstance(values, (list, tuple)):
        raise CheckpointError(f"{where}: a list of integers is required, got {values!r}")
    for d in values:
        if not isinstance(d, int) or isinstance(d, bool):
            raise CheckpointError(f"{where}: {d!r} is not an integer")
        if not 1 <= d < hidden_size:
            raise CheckpointError(
                f"{where}: {d} is outside 1..{hidden_size - 1} (the hidden size {hidden_size} is the full vector)"
            )
    sizes = tuple(sorted(set(values)))
    if len(sizes) > MAX_DIMENSIONS:
        raise CheckpointError(f"{where}: {len(sizes)} sizes (at most {MAX_DIMENSIONS})")
    return sizes


def parse_dimensions(text: str) -> list[int]:
    """`--dimensions 64,128` -> [64, 128] (each checked against the hidden size once it is known)."""
    parts = [p.strip() for p in text.split(",")]
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ExportError(f"--dimensions: {text!r} is not a comma-separated list of integers") from None


def _prompts(config: dict, where: str) -> tuple[dict[str, str], str | None]:
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict):
        raise CheckpointError(f"{where}: prompts must be an object of name -> text, got {prompts!r}")
    if len(prompts) > MAX_PROMPTS:
        raise CheckpointError(f"{where}: {len(prompts)} prompts (at most {MAX_PROMPTS})")
    for name, text in prompts.items():
        if not name or not isinstance(text, str) or len(text) > MAX_PROMPT_CHARS:
            raise CheckpointError(
                f"{where}: prompt {name!r} must be a non-empty name with a text of at most "
                f"{MAX_PROMPT_CHARS} characters, got {text!r:.80}"
            )
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise CheckpointError(
            f"{where}: default_prompt_name {default!r} is not one of its prompts {sorted(prompts)}"
        )
    return dict(prompts), default


def read_embedding_options(
    directory: Path, hidden_size: int, dimensions: list[int] | None = None, include_prompt: bool = True
) -> EmbeddingOptions:
    """The checkpoint's options; `dimensions` (from --dimensions) replaces its matryoshka_dimensions.
    `include_prompt`: its Pooling module's; False (pool without the prompt's tokens) is refused with prompts."""
    path = Path(directory) / ST_CONFIG
    config = json_or_empty(path)
    prompts, default = _prompts(config, str(path))
    if prompts and not include_prompt:
        raise CheckpointError(
            f"{directory}: its Pooling leaves the prompt's tokens out (include_prompt false); bertserve pools "
            "every token, so it cannot serve its prompts"
        )
    if dimensions is not None:
        checked = check_dimensions(dimensions, hidden_size, "--dimensions")
    else:
        checked = check_dimensions(config.get(DIMENSIONS_KEY) or [], hidden_size, f"{path}: {DIMENSIONS_KEY}")
    return EmbeddingOptions(checked, prompts, default)
