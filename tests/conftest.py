"""Shared session fixtures: small random checkpoints and exported model repositories.

- `make_tiny_checkpoint(kind, **overrides)`: a random Hugging Face checkpoint directory (see
  tests/helpers/checkpoints.py), cached per arguments for the session.
- `default_repo`: a repository holding all-MiniLM-L6-v2 version 1 exported once per session through
  the CLI (`bertserve export --default`: graphs encoder, encoder_int8, encoder_fp16).
- `tiny_repo`: a repository with three tiny random models (hidden 48, 3 heads, vocab 777), each with
  encoder, encoder_int8, encoder_fp16 and encoder_attentions: `tiny-embed` (BertModel with pooler),
  `tiny-mlm` (BertForMaskedLM + mlm_head), `tiny-classifier` (BertForSequenceClassification + classifier_head).
- `shared_repo`: heads on a shared encoder (schema 2): `tiny-encoder` (the tiny BertModel with pooler; encoder,
  encoder_int8, encoder_fp16, encoder_attentions) and two head-only models on it, exported with
  `encoder="tiny-encoder"`: `tiny-shared-mlm` (mlm_head) and `tiny-shared-classifier` (classifier_head holding
  its own pooler, input cls_hidden_state). Their checkpoints take tiny-encoder's embeddings and layers.
- `pair_repo` (tests/pair_models.py): sentence-pair models exported through `bertserve export` (fp32 graphs,
  version 1): `tiny-pair-classifier` (BertForSequenceClassification, 3 labels, `--pairs`), `tiny-cross-encoder`
  (a sentence-transformers CrossEncoder, num_labels 1, max_length 40, saved by `CrossEncoder.save`) and
  `tiny-embed` (BertModel). `tiny_pair_classifier` and `tiny_cross_encoder` are the first two as `PairModel`s
  (their directory and manifest, transformers' model and tokenizer, and the CrossEncoder, for expected outputs).
- `st_model_dir` (tests/embedding_models.py): a tiny random sentence-transformers model (BertModel + mean Pooling +
  Normalize; prompts {"query": "query: ", "document": "passage: "}, default_prompt_name "query",
  matryoshka_dimensions [8, 16], max_seq_length 64); `st_repo`: it exported as `tiny-st`, plus `tiny-mlm` from
  `make_tiny_checkpoint("BertForMaskedLM")` for sparse outputs (fp32 graphs, version 1).

The repositories are shared by every test of the session: treat them as read-only (copy one with
shutil.copytree before tampering with it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.checkpoints import make_checkpoint

DEFAULT_MODEL_NAME = "all-minilm-l6-v2"
# Servers started by tests (in-process or `bertserve serve` children) pick a free HTTP port unless a test
# names one: the default 8080 would collide between servers running at once.
os.environ.setdefault("BERTSERVE_HTTP_PORT", "0")
TINY_MODELS = {
    "tiny-embed": "BertModel",
    "tiny-mlm": "BertForMaskedLM",
    "tiny-classifier": "BertForSequenceClassification",
}


@pytest.fixture(scope="session")
def make_tiny_checkpoint(tmp_path_factory):
    cache: dict[tuple, Path] = {}

    def make(kind: str = "BertModel", **overrides) -> Path:
        key = (kind, tuple(sorted(overrides.items())))
        if key not in cache:
            directory = tmp_path_factory.mktemp(f"ckpt-{kind}")
            cache[key] = make_checkpoint(directory, kind, **overrides)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def default_repo(tmp_path_factory) -> Path:
    from bertserve.cli import main

    repo = tmp_path_factory.mktemp("default-repo")
    code = main(["export", "--default", "--out", str(repo)])
    assert code == 0, "bertserve export --default failed"
    return repo


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory, make_tiny_checkpoint) -> Path:
    from bertserve.export.pipeline import export_model

    repo = tmp_path_factory.mktemp("tiny-repo")
    for name, kind in TINY_MODELS.items():
        export_model(
            make_tiny_checkpoint(kind),
            repo,
            name=name,
            version=1,
            int8=True,
            fp16=True,
            attentions=True,
            log=lambda _: None,
        )
    return repo


SHARED_ENCODER = "tiny-encoder"
SHARED_HEADS = {
    "tiny-shared-mlm": "BertForMaskedLM",
    "tiny-shared-classifier": "BertForSequenceClassification",
}


@pytest.fixture(scope="session")
def shared_repo(tmp_path_factory, make_tiny_checkpoint) -> Path:
    from bertserve.export.pipeline import export_model

    repo = tmp_path_factory.mktemp("shared-repo")
    base = make_tiny_checkpoint("BertModel")
    quiet = dict(log=lambda _: None)
    export_model(base, repo, name=SHARED_ENCODER, version=1, int8=True, fp16=True, attentions=True, **quiet)
    for name, kind in SHARED_HEADS.items():
        checkpoint = make_tiny_checkpoint(kind, seed=1, encoder_from=base)
        export_model(checkpoint, repo, name=name, version=1, encoder=SHARED_ENCODER, **quiet)
    return repo


@pytest.fixture(scope="session")
def _pair_models(tmp_path_factory):
    from tests.pair_models import export_pair_repo

    return export_pair_repo(tmp_path_factory.mktemp("pair-repo"), tmp_path_factory.mktemp("pair-checkpoints"))


@pytest.fixture(scope="session")
def pair_repo(_pair_models) -> Path:
    from tests.pair_models import PAIR_CLASSIFIER

    return _pair_models[PAIR_CLASSIFIER].repo


@pytest.fixture(scope="session")
def tiny_pair_classifier(_pair_models):
    from tests.pair_models import PAIR_CLASSIFIER

    return _pair_models[PAIR_CLASSIFIER]


@pytest.fixture(scope="session")
def tiny_cross_encoder(_pair_models):
    from tests.pair_models import CROSS_ENCODER

    return _pair_models[CROSS_ENCODER]


# --- serving side (added by the server's engineer) --------------------------------------------------


@pytest.fixture(scope="session")
def tiny_server(tiny_repo):
    """An in-process server (tests/helpers/server.py) on `tiny_repo`, shared by the session; read-only use."""
    from tests.helpers.server import ServerThread

    with ServerThread(model_repo=tiny_repo, max_queue_delay_ms=5) as server:
        yield server


@pytest.fixture(scope="session")
def grpc_pair_models(tmp_path_factory):
    """tests/helpers/pair_grpc.py's models, exported once for tests/test_pairs_grpc*.py."""
    from tests.helpers.pair_grpc import export_models

    return export_models(tmp_path_factory)


# --- embedding options (issue 28): tests/embedding_models.py -----------------------------------------


@pytest.fixture(scope="session")
def st_model_dir(tmp_path_factory) -> Path:
    """The tiny sentence-transformers model's directory (prompts, Matryoshka [8, 16]): load it with
    `SentenceTransformer(str(st_model_dir), device="cpu")` for parity."""
    from tests.embedding_models import make_st_model

    return make_st_model(tmp_path_factory.mktemp("st-model"), tmp_path_factory.mktemp("st-scratch"))


@pytest.fixture(scope="session")
def st_repo(tmp_path_factory, st_model_dir, make_tiny_checkpoint) -> Path:
    """A repository with "tiny-st" (st_model_dir) and "tiny-mlm" (make_tiny_checkpoint("BertForMaskedLM")),
    fp32 graphs, version 1; read-only."""
    from tests.embedding_models import export_st_repo

    repo = tmp_path_factory.mktemp("st-repo")
    return export_st_repo(repo, st_model_dir, make_tiny_checkpoint("BertForMaskedLM"))
