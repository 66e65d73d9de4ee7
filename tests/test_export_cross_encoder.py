"""Recognition of sentence-transformers CrossEncoder checkpoints in the formats its versions write, each
checked against what sentence-transformers itself loads from the same directory (activation, max length)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from torch import nn

from bertserve.cli import main
from bertserve.export.cross_encoder import ST_CONFIG, read_cross_encoder
from bertserve.export.errors import CheckpointError
from bertserve.repository import read_manifest
from tests.pair_models import CROSS_ENCODER_MAX_LENGTH, make_cross_encoder, make_pair_classifier

LIMIT = 72  # the tiny models' position embeddings
ST_ACTIVATIONS = {nn.Sigmoid: "sigmoid", nn.Identity: "identity", nn.Softmax: "softmax"}
IDENTITY = "torch.nn.modules.linear.Identity"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """CrossEncoders as sentence-transformers 6.x saves them: one label (sigmoid), three labels."""
    scratch = tmp_path_factory.mktemp("cross-encoders")
    return {
        "one": make_cross_encoder(scratch / "one", scratch / "one-base"),
        "three": make_cross_encoder(scratch / "three", scratch / "three-base", num_labels=3),
    }


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def _as_before_v6(directory: Path) -> None:
    """Drops the files sentence-transformers 6.x adds: what is left is a transformers checkpoint."""
    for name in (ST_CONFIG, "modules.json", "sentence_bert_config.json", "README.md"):
        (directory / name).unlink(missing_ok=True)


def _variant(name: str, saved: dict[str, Path], tmp_path: Path) -> tuple[Path, int]:
    labels = 3 if name.startswith("three") else 1
    directory = Path(shutil.copytree(saved["three" if labels == 3 else "one"], tmp_path / name))
    if name == "v6_identity":
        _edit_json(directory / ST_CONFIG, activation_fn=IDENTITY)
    elif name in ("v6_unnamed", "three_v6_unnamed"):
        _edit_json(directory / ST_CONFIG, activation_fn=None)
    elif name == "v4_config":
        _as_before_v6(directory)
        _edit_json(
            directory / "config.json", sentence_transformers={"activation_fn": IDENTITY, "version": "4.1.0"}
        )
    elif name == "legacy_config":
        _as_before_v6(directory)
        _edit_json(directory / "config.json", sbert_ce_default_activation_function=IDENTITY)
    elif name == "legacy_softmax":
        _as_before_v6(directory)
        _edit_json(directory / "config.json", sbert_ce_default_activation_function="torch.nn.Softmax")
    elif name == "long_max_length":
        _edit_json(directory / "tokenizer_config.json", model_max_length=100)
    return directory, labels


@pytest.mark.parametrize(
    "name, activation, max_length",
    [
        ("as_saved", "sigmoid", CROSS_ENCODER_MAX_LENGTH),
        ("v6_identity", "identity", CROSS_ENCODER_MAX_LENGTH),
        ("v6_unnamed", "sigmoid", CROSS_ENCODER_MAX_LENGTH),  # one label, none named: sigmoid, as it does
        ("three_v6_unnamed", "identity", CROSS_ENCODER_MAX_LENGTH),
        ("v4_config", "identity", CROSS_ENCODER_MAX_LENGTH),
        ("legacy_config", "identity", CROSS_ENCODER_MAX_LENGTH),
        ("legacy_softmax", "softmax", CROSS_ENCODER_MAX_LENGTH),
        ("long_max_length", "sigmoid", LIMIT),  # kept within the position embeddings
    ],
)
def test_recognised_as_sentence_transformers_loads_it(name, activation, max_length, saved, tmp_path):
    from sentence_transformers import CrossEncoder

    directory, labels = _variant(name, saved, tmp_path)
    spec = read_cross_encoder(directory, labels, LIMIT)
    assert spec is not None
    assert (spec.activation, spec.max_length) == (activation, max_length)
    loaded = CrossEncoder(str(directory), device="cpu")
    assert ST_ACTIVATIONS[type(loaded.activation_fn)] == activation
    assert loaded.max_seq_length == max_length and loaded.num_labels == labels


def test_not_cross_encoders(tmp_path, make_tiny_checkpoint):
    classifier = make_pair_classifier(tmp_path / "classifier")
    assert read_cross_encoder(classifier, 3, LIMIT) is None
    embedder = shutil.copytree(make_tiny_checkpoint("BertModel"), tmp_path / "embedder")
    (embedder / ST_CONFIG).write_text(json.dumps({"model_type": "SentenceTransformer"}))
    assert read_cross_encoder(embedder, 2, LIMIT) is None


def test_unknown_activation_fails_the_export_naming_it(saved, tmp_path, capsys):
    directory = Path(shutil.copytree(saved["one"], tmp_path / "tanh"))
    _edit_json(directory / ST_CONFIG, activation_fn="torch.nn.modules.activation.Tanh")
    with pytest.raises(CheckpointError, match="torch.nn.modules.activation.Tanh"):
        read_cross_encoder(directory, 1, LIMIT)
    repo = tmp_path / "repo"
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(directory), "--out", str(repo)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and lines[1] == "nothing was written"
    assert "cross-encoder activation 'torch.nn.modules.activation.Tanh' is not supported" in lines[0]
    assert not repo.exists() or not any(repo.iterdir())


def test_legacy_cross_encoder_exports_with_its_activation(saved, tmp_path):
    """A pre-4.0 CrossEncoder (only config.json marks it) exports as one, without --pairs."""
    directory, _ = _variant("legacy_config", saved, tmp_path)
    repo = tmp_path / "repo"
    assert main(["export", "--checkpoint", str(directory), "--out", str(repo), "--name", "legacy"]) == 0
    manifest = read_manifest(repo / "legacy" / "1")
    assert manifest.tasks.classify.pairs is True
    assert manifest.tasks.classify.cross_encoder.activation == "identity"
    assert manifest.max_length == CROSS_ENCODER_MAX_LENGTH
