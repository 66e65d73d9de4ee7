"""`bertserve export --encoder`: heads written without a copy of their encoder, their graphs against
transformers, and the refusals (another encoder, other sizes); config sizes refused before allocation;
stale staging directories removed by the next export."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort
import pytest
import torch

from bertserve.cli import main
from bertserve.export.staging import STALE_AFTER_S, remove_stale_staging
from bertserve.repository import Manifest, sha256_file
from tests.conftest import SHARED_ENCODER, SHARED_HEADS
from tests.helpers.checkpoints import load_reference

TOLERANCE = 1e-4


def session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _nothing_written(model_dir) -> bool:
    return not model_dir.exists() or not any(model_dir.iterdir())


def test_head_only_models_hold_heads_and_a_pinned_reference(shared_repo):
    encoder_dir = shared_repo / SHARED_ENCODER / "1"
    for name in SHARED_HEADS:
        directory = shared_repo / name / "1"
        manifest = Manifest.read(directory)
        assert manifest.schema_version == 2 and manifest.encoder.name == SHARED_ENCODER
        assert manifest.encoder.manifest_sha256 == sha256_file(encoder_dir / "manifest.json")
        tied = [manifest.tasks.tied_decoder.file] if manifest.tasks.tied_decoder else []
        assert sorted(p.name for p in directory.iterdir()) == sorted(
            ["manifest.json", *tied, *(spec.file for spec in manifest.graphs.values())]
        )  # no encoder graph, no tokenizer (a tied MLM head: its decoder table, see test_tied_decoder.py)
        assert manifest.tokenizer == Manifest.read(encoder_dir).tokenizer
        assert "shared_encoder" in manifest.export.seconds  # the encoder was checked against this checkpoint


def test_head_only_models_match_transformers_through_the_shared_encoder(shared_repo, make_tiny_checkpoint):
    """The served path (the encoder model's graph, then the head model's head) against the head checkpoint."""
    base = make_tiny_checkpoint("BertModel")
    encoder = session(shared_repo / SHARED_ENCODER / "1" / "encoder.onnx")
    rng = np.random.default_rng(3)
    ids = rng.integers(5, 777, size=(3, 11))
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    feed = {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    hidden = dict(zip([o.name for o in encoder.get_outputs()], encoder.run(None, feed), strict=True))
    torch_feed = {k: torch.from_numpy(v) for k, v in feed.items()}
    for name, kind in SHARED_HEADS.items():
        reference = load_reference(make_tiny_checkpoint(kind, seed=1, encoder_from=base))
        with torch.no_grad():
            expected = reference(**torch_feed).logits.numpy()
        head_dir = shared_repo / name / "1"
        if kind == "BertForMaskedLM":
            rows = mask.astype(bool)
            tied = Manifest.read(head_dir).tasks.fill_mask.tied_decoder  # the checkpoint ties its decoder
            got = session(head_dir / "mlm_head.onnx").run(
                None,
                {
                    "hidden_states": hidden["last_hidden_state"][rows],
                    tied.input: np.load(head_dir / tied.file),
                },
            )
            assert np.abs(got[0] - expected[rows]).max() <= TOLERANCE
        else:  # the head holds the checkpoint's own pooler, fed the [CLS] row
            cls = np.ascontiguousarray(hidden["last_hidden_state"][:, 0])
            got = session(head_dir / "classifier_head.onnx").run(None, {"cls_hidden_state": cls})
            assert np.abs(got[0] - expected).max() <= TOLERANCE
            pooled = hidden["pooler_output"]  # the encoder's own pooler is not the classifier's
            assert (
                np.abs(
                    session(head_dir / "classifier_head.onnx").run(None, {"cls_hidden_state": pooled})[0]
                    - expected
                ).max()
                > 1e-2
            )


@pytest.fixture
def encoder_repo(shared_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(shared_repo / SHARED_ENCODER, repo / SHARED_ENCODER)
    return repo


def test_refuses_a_checkpoint_whose_encoder_is_another(encoder_repo, make_tiny_checkpoint, capsys):
    other = make_tiny_checkpoint("BertForSequenceClassification", seed=2)  # its own random encoder
    args = [
        "export",
        "--checkpoint",
        str(other),
        "--out",
        str(encoder_repo),
        "--name",
        "c",
        "--encoder",
        SHARED_ENCODER,
    ]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "is not encoder tiny-encoder:1's" in err and "encoder.onnx differs from it by" in err
    assert "Traceback" not in err and _nothing_written(encoder_repo / "c")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--encoder", "nope"], "holds no exported version"),
        (["--encoder", f"{SHARED_ENCODER}:9"], "has no version 9"),
        (["--encoder", SHARED_ENCODER, "--int8"], "with --encoder the encoder's are used"),
        (["--encoder", SHARED_ENCODER, "--name", SHARED_ENCODER], "needs a name of its own"),
    ],
)
def test_refuses_bad_encoder_arguments(encoder_repo, make_tiny_checkpoint, capsys, args, needle):
    checkpoint = make_tiny_checkpoint(
        "BertForMaskedLM", seed=1, encoder_from=make_tiny_checkpoint("BertModel")
    )
    assert (
        main(["export", "--checkpoint", str(checkpoint), "--out", str(encoder_repo), "--name", "m", *args])
        == 1
    )
    assert needle in capsys.readouterr().err and _nothing_written(encoder_repo / "m")
    assert sorted(p.name for p in (encoder_repo / SHARED_ENCODER).iterdir()) == ["1"]


def test_refuses_a_checkpoint_of_other_sizes(encoder_repo, make_tiny_checkpoint, capsys):
    checkpoint = make_tiny_checkpoint("BertForMaskedLM", max_position_embeddings=40)
    args = [
        "export",
        "--checkpoint",
        str(checkpoint),
        "--out",
        str(encoder_repo),
        "--encoder",
        SHARED_ENCODER,
    ]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert (
        "does not match encoder tiny-encoder:1 in dimensions (checkpoint vs encoder): max_position_embeddings 40 vs 72"
        in err
        and "Traceback" not in err
    )


@pytest.mark.parametrize(
    ("sizes", "needle"),
    [
        ({"hidden_size": 1e9}, "hidden_size must be a positive integer, got 1000000000.0"),
        ({"hidden_size": 1_000_000_002, "num_attention_heads": 2}, "an ONNX graph file holds at most 2 GiB"),
        ({"vocab_size": -3}, "vocab_size must be a positive integer"),
        ({"hidden_size": 50}, "hidden_size 50 is not a multiple of num_attention_heads 3"),
        ({"num_hidden_layers": True}, "num_hidden_layers must be a positive integer"),
    ],
)
def test_refuses_impossible_sizes_in_one_line(tmp_path, make_tiny_checkpoint, sizes, needle):
    """Through the console script: one line, exit 1, nothing written, no allocation attempted."""
    checkpoint = shutil.copytree(make_tiny_checkpoint("BertModel"), tmp_path / "ckpt")
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, **sizes}))
    repo = tmp_path / "repo"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertserve.cli",
            "export",
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(repo),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 2, result.stderr  # the error, "nothing was written"
    assert "config.json" in lines[0] and needle in lines[0], lines[0]
    assert not repo.exists()


def test_the_next_export_removes_stale_staging_directories(tmp_path, make_tiny_checkpoint):
    model_dir = tmp_path / "repo" / "m"
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid, live_pid = int(finished.stdout), os.getppid()
    dead = model_dir / f".staging-1-{dead_pid}-abc"
    live = model_dir / f".staging-1-{live_pid}-def"  # an export that may still be running: kept
    old_unnamed, new_unnamed = (
        model_dir / ".staging-1-old",
        model_dir / ".staging-1-new",
    )  # no pid in the name
    for directory in (dead, live, old_unnamed, new_unnamed):
        directory.mkdir(parents=True)
    long_ago = time.time() - STALE_AFTER_S - 60
    os.utime(old_unnamed, (long_ago, long_ago))
    assert (
        main(
            [
                "export",
                "--checkpoint",
                str(make_tiny_checkpoint("BertModel")),
                "--out",
                str(tmp_path / "repo"),
                "--name",
                "m",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(["1", live.name, new_unnamed.name])
    assert remove_stale_staging(model_dir, print) == []
