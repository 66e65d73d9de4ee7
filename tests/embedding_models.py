"""A tiny random sentence-transformers embedding model for the embedding-option tests, exported through
`bertserve export`.

- `make_st_model(directory, scratch)`: BertModel (the tiny sizes of tests/helpers/checkpoints.py, hidden 48,
  weights drawn wider than transformers' default) + Pooling (mean) + Normalize, saved by
  `SentenceTransformer.save` with PROMPTS, DEFAULT_PROMPT_NAME and MAX_SEQ_LENGTH; its
  config_sentence_transformers.json then gains `matryoshka_dimensions` (MATRYOSHKA_DIMENSIONS), the key
  `bertserve export` reads the Matryoshka sizes from.
- `export_st_repo(repo, st_model, mlm_checkpoint)`: that model as ST_MODEL ("tiny-st") and the fill-mask
  checkpoint (for sparse outputs) as MLM_MODEL ("tiny-mlm"), exported with the CLI (fp32 graphs, version 1).

The session fixtures `st_model_dir` and `st_repo` (tests/conftest.py) call these; the fill-mask checkpoint is
`make_tiny_checkpoint("BertForMaskedLM")`, the one tiny_repo's tiny-mlm comes from.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.checkpoints import export_all, make_checkpoint

ST_MODEL = "tiny-st"
MLM_MODEL = "tiny-mlm"
HIDDEN = 48  # tests/helpers/checkpoints.py TINY
PROMPTS = {"query": "query: ", "document": "passage: "}
DEFAULT_PROMPT_NAME = "query"
MATRYOSHKA_DIMENSIONS = [8, 16]
MAX_SEQ_LENGTH = 64  # below the tiny models' 72 position embeddings: the manifest's max_length
ST_CONFIG = "config_sentence_transformers.json"
# As tests/pair_models.py: at transformers' 0.02 a tiny random model's outputs barely depend on the input.
INIT_RANGE = 0.2


def make_st_model(directory: Path, scratch: Path, seed: int = 21) -> Path:
    """Writes the sentence-transformers model into directory and returns it."""
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers 6.x
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Normalize, Pooling, Transformer

    base = make_checkpoint(Path(scratch) / "st-base", "BertModel", seed=seed, initializer_range=INIT_RANGE)
    transformer = Transformer(str(base), max_seq_length=MAX_SEQ_LENGTH)
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(
        modules=[transformer, pooling, Normalize()],
        device="cpu",
        prompts=PROMPTS,
        default_prompt_name=DEFAULT_PROMPT_NAME,
    )
    model.save(str(directory))
    config_path = Path(directory) / ST_CONFIG
    config = json.loads(config_path.read_text())
    config["matryoshka_dimensions"] = MATRYOSHKA_DIMENSIONS
    config_path.write_text(json.dumps(config, indent=2))
    return Path(directory)


def export_st_repo(repo: Path, st_model: Path, mlm_checkpoint: Path) -> Path:
    """Exports ST_MODEL (from st_model, make_st_model's directory) and MLM_MODEL (from mlm_checkpoint) into
    repo; returns repo."""
    return export_all(repo, [(ST_MODEL, st_model, []), (MLM_MODEL, mlm_checkpoint, [])])


def version_dir(repo: Path, name: str = ST_MODEL) -> Path:
    """The exported version's directory (its manifest.json, graphs and tokenizer)."""
    return Path(repo) / name / "1"
