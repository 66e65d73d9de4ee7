"""Loading a model repository (service/engine/repository.py on the contract bertserve/repository.py): what is not a
model is ignored with one WARNING; a broken newer version falls back to the newest complete one with a
WARNING naming the fault; a version named explicitly, or a model with no complete version, stops the server
with one line naming the file; head-only models resolve to their encoder model, checked by sha256."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

from bertserve.repository import MODEL_SPEC, list_versions, parse_model_spec, sha256_file, staging_owner_pid
from bertserve.service.engine.repository import discover
from bertserve.service.errors import StartupError
from tests.conftest import SHARED_ENCODER, SHARED_HEADS


def _manifest(version_dir):
    return json.loads((version_dir / "manifest.json").read_text())


def _write(version_dir, manifest):
    (version_dir / "manifest.json").write_text(json.dumps(manifest))


def _copy_version(repo, name, source_dir, version):
    target = repo / name / str(version)
    shutil.copytree(source_dir, target)
    manifest = _manifest(target)
    manifest["version"] = version
    _write(target, manifest)
    return target


# Each way a newer version can be half-written; the server must fall back to version 1.
HALF_WRITTEN = {
    "no manifest": (lambda d: (d / "manifest.json").unlink(), "manifest.json: missing"),
    "missing graph": (
        lambda d: (d / "encoder.onnx").unlink(),
        "graph encoder listed in the manifest is missing",
    ),
    "corrupt graph": (lambda d: (d / "encoder.onnx").write_bytes(b"half"), "does not match the manifest"),
    "truncated manifest": (
        lambda d: (d / "manifest.json").write_text((d / "manifest.json").read_text()[:200]),
        "invalid manifest",
    ),
}


@pytest.fixture
def cluttered_repo(tiny_repo, tmp_path):
    """tiny-embed version 1 complete, plus everything a real volume or a killed export leaves around."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo / "tiny-embed", repo / "tiny-embed")
    (repo / "lost+found").mkdir()
    (repo / "README.txt").write_text("not a model")
    (repo / "empty-model").mkdir()
    (repo / "tiny-embed" / ".staging-2-999999-abcd").mkdir()
    (repo / "tiny-embed" / "notes.txt").write_text("stray")
    (repo / ".default-exported").touch()  # the Makefile's stamp: hidden, ignored silently
    return repo


def test_entries_that_are_not_models_are_ignored_with_one_warning_each(cluttered_repo, caplog):
    with caplog.at_level(logging.WARNING, logger="bertserve.service.engine.repository"):
        (files,) = discover(cluttered_repo, [], "fp32")
    assert (files.name, files.version) == ("tiny-embed", 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for needle in ("lost+found", "README.txt", "empty-model", ".staging-2-999999-abcd", "notes.txt"):
        assert sum(needle in w for w in warnings) == 1, (needle, warnings)
    assert not any(".default-exported" in w for w in warnings)


@pytest.mark.parametrize("fault", list(HALF_WRITTEN))
def test_a_broken_newer_version_falls_back_to_the_newest_complete_one(cluttered_repo, caplog, fault):
    breaker, needle = HALF_WRITTEN[fault]
    source = cluttered_repo / "tiny-embed" / "1"
    _copy_version(cluttered_repo, "tiny-embed", source, 2)  # complete
    breaker(_copy_version(cluttered_repo, "tiny-embed", source, 3))
    with caplog.at_level(logging.WARNING, logger="bertserve.service.engine.repository"):
        (files,) = discover(cluttered_repo, [], "fp32")
    assert files.version == 2
    (warning,) = [r.getMessage() for r in caplog.records if "newer version is broken" in r.getMessage()]
    assert "tiny-embed/3" in warning and needle in warning
    # Named without a version: the same choice. Named with the broken version: the server stops.
    assert discover(cluttered_repo, [("tiny-embed", None)], "fp32")[0].version == 2
    with pytest.raises(StartupError) as error:
        discover(cluttered_repo, [("tiny-embed", 3)], "fp32")
    assert "tiny-embed/3" in str(error.value) and needle in str(error.value)


def test_a_model_without_any_complete_version_stops_the_server(cluttered_repo):
    """Chosen behaviour: serving the rest of the repository would hide a model the operator deployed."""
    (cluttered_repo / "tiny-embed" / "1" / "encoder.onnx").unlink()
    shutil.copytree(cluttered_repo / "tiny-embed" / "1", cluttered_repo / "tiny-embed" / "2")
    (cluttered_repo / "tiny-embed" / "2" / "manifest.json").unlink()
    with pytest.raises(StartupError) as error:
        discover(cluttered_repo, [], "fp32")
    message = str(error.value)
    assert (
        "tiny-embed/2/manifest.json: missing" in message
        and "no older version of tiny-embed is complete" in message
    )
    assert "\n" not in message


def test_a_repository_of_strays_only_is_refused(tmp_path):
    (tmp_path / "lost+found").mkdir()
    (tmp_path / "m" / ".staging-1-1-x").mkdir(parents=True)
    with pytest.raises(StartupError, match="holds no model directories"):
        discover(tmp_path, [], "fp32")


def test_head_only_models_resolve_to_their_encoder(shared_repo):
    found = {f.name: f for f in discover(shared_repo, [], "int8")}
    assert set(found) == {SHARED_ENCODER, *SHARED_HEADS}
    encoder = found[SHARED_ENCODER]
    assert not encoder.shares_encoder and encoder.head_paths == {}
    for name in SHARED_HEADS:
        files = found[name]
        assert files.shares_encoder and (files.encoder_name, files.encoder_version) == (SHARED_ENCODER, 1)
        assert (
            files.encoder_path
            == encoder.encoder_path
            == shared_repo / SHARED_ENCODER / "1" / "encoder_int8.onnx"
        )
        assert files.encoder_sha256 == encoder.encoder_sha256 == sha256_file(files.encoder_path)
        assert (
            files.attentions_path == encoder.attentions_path
            and files.tokenizer_path == encoder.tokenizer_path
        )
        (head_key,) = files.head_paths
        assert files.head_paths[head_key] == shared_repo / name / "1" / f"{head_key}.onnx"
        assert set(files.own_manifest.graphs) == {head_key} and files.own_manifest.schema_version == 2
        assert {"encoder", "encoder_int8", "encoder_fp16", "encoder_attentions", head_key} == set(
            files.manifest.graphs
        )
        assert files.graph_path("encoder_fp16") == shared_repo / SHARED_ENCODER / "1" / "encoder_fp16.onnx"
    assert found["tiny-shared-classifier"].manifest.tasks.classify.encoder_output == "cls_hidden_state"


@pytest.fixture
def shared_copy(shared_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(shared_repo, repo)
    return repo


def test_an_encoder_that_changed_under_its_heads_stops_the_server(shared_copy):
    encoder_dir = shared_copy / SHARED_ENCODER / "1"
    manifest = _manifest(encoder_dir)
    manifest["export"]["created_at"] = "2000-01-01T00:00:00+00:00"  # any edit changes its sha256
    _write(encoder_dir, manifest)
    with pytest.raises(StartupError) as error:
        discover(shared_copy, [("tiny-shared-mlm", 1)], "fp32")
    message = str(error.value)
    assert f"{encoder_dir / 'manifest.json'}: sha256" in message and "tiny-shared-mlm" in message


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda m: m.update(max_length=16), "max_length differs from its encoder's"),
        (lambda m: m["tokenizer"].update(mask_token_id=5), "tokenizer differs from its encoder's"),
        (lambda m: m["encoder"].update(version=7), "tiny-encoder/7/manifest.json: missing"),
        (lambda m: m["graphs"].update(encoder=m["graphs"]["mlm_head"]), "lists encoder graphs ['encoder']"),
    ],
)
def test_a_head_only_manifest_that_does_not_fit_its_encoder_is_refused(shared_copy, edit, needle):
    head_dir = shared_copy / "tiny-shared-mlm" / "1"
    manifest = _manifest(head_dir)
    edit(manifest)
    _write(head_dir, manifest)
    with pytest.raises(StartupError) as error:
        discover(shared_copy, [("tiny-shared-mlm", 1)], "fp32")
    assert needle in str(error.value)


def test_contract_names_versions_and_staging_names(tmp_path):
    for entry in ("1", "2", "10", "0", "01", "01x", "\u00b2", ".staging-3-1-a", "lost+found"):
        (tmp_path / entry).mkdir()
    (tmp_path / "4").write_text("a file, not a version")
    assert list_versions(tmp_path) == [1, 2, 10]
    assert parse_model_spec("all-minilm-l6-v2:3") == ("all-minilm-l6-v2", 3)
    assert parse_model_spec("m") == ("m", None)
    for bad in ("../etc", "m:0", "m:", "-m", "a" * 65):
        assert not MODEL_SPEC.match(bad)
    assert (
        staging_owner_pid(".staging-3-4242-k2j_x") == 4242 and staging_owner_pid(".staging-3-k2j_x") is None
    )


def test_the_contract_imports_without_torch():
    script = "import sys, bertserve.repository, bertserve.manifest; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=os.environ
    )
    assert result.stdout.strip() == "False"


def test_schema_1_repositories_still_load(tiny_repo, tmp_path):
    """A manifest as schema 1 wrote it (no `encoder`, no `tasks.classify.encoder_output`): a full model."""
    repo = tmp_path / "repo"
    for name in ("tiny-classifier", "tiny-mlm"):
        shutil.copytree(tiny_repo / name, repo / name)
        manifest = _manifest(repo / name / "1")
        manifest["schema_version"] = 1
        del manifest["encoder"]
        if manifest["tasks"]["classify"]:
            del manifest["tasks"]["classify"]["encoder_output"]
        _write(repo / name / "1", manifest)
    found = {f.name: f for f in discover(repo, [], "fp32")}
    assert all(not f.shares_encoder and f.own_manifest.schema_version == 1 for f in found.values())
    assert found["tiny-classifier"].manifest.tasks.classify.encoder_output == "pooler_output"
    manifest = _manifest(repo / "tiny-mlm" / "1")
    manifest["encoder"] = {"name": "tiny-classifier", "version": 1, "manifest_sha256": "0" * 64}
    _write(repo / "tiny-mlm" / "1", manifest)
    with pytest.raises(StartupError, match="an encoder reference needs schema_version 2"):
        discover(repo, [("tiny-mlm", 1)], "fp32")
