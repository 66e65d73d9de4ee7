"""`bertserve export` of an embedding model's options: Matryoshka dimensions, prompts, int8/uint8 calibration
ranges (DESIGN of issue 28), from the sentence-transformers config or `--dimensions`, and every refusal."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer

from bertserve.cli import main
from bertserve.export import calibration
from bertserve.export.embedding_defaults import read_embedding_defaults
from bertserve.export.embedding_options import check_dimensions, read_embedding_options
from bertserve.export.errors import CheckpointError
from bertserve.repository import Manifest
from tests.conftest import DEFAULT_MODEL_NAME
from tests.embedding_models import (
    DEFAULT_PROMPT_NAME,
    HIDDEN,
    MATRYOSHKA_DIMENSIONS,
    MAX_SEQ_LENGTH,
    MLM_MODEL,
    PROMPTS,
    ST_CONFIG,
    ST_MODEL,
    version_dir,
)
from tests.helpers.checkpoints import make_checkpoint

ST_TOLERANCE = 1e-5


def export(checkpoint, repo, *extra) -> int:
    argv = ["export", "--checkpoint", str(checkpoint), "--out", str(repo), "--name", "m", "--version", "1"]
    return main([*argv, *extra])


def embed_task(repo, name="m"):
    return Manifest.read(version_dir(repo, name)).tasks.embed


def edited_copy(st_model_dir, tmp_path, **changes):
    """st_model_dir copied, its config_sentence_transformers.json keys set (None: removed)."""
    directory = shutil.copytree(st_model_dir, tmp_path / "edited")
    path = directory / ST_CONFIG
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))
    return directory


def test_the_manifest_records_the_sentence_transformers_options(st_repo):
    st = Manifest.read(version_dir(st_repo, ST_MODEL))
    embed = st.tasks.embed
    assert (embed.pooling, embed.normalize, embed.dimension, st.max_length) == (
        "mean",
        True,
        HIDDEN,
        MAX_SEQ_LENGTH,
    )
    assert embed.dimensions == MATRYOSHKA_DIMENSIONS
    assert embed.prompts == PROMPTS and embed.default_prompt_name == DEFAULT_PROMPT_NAME
    texts = len(calibration.calibration_texts())
    assert embed.calibration_texts == texts >= 300
    sizes = [*MATRYOSHKA_DIMENSIONS, HIDDEN]
    assert sorted(embed.calibration_ranges) == sorted(
        f"{d}:{k}" for d in sizes for k in ("normalized", "raw")
    )
    for key, ranges in embed.calibration_ranges.items():
        d = int(key.split(":")[0])
        assert np.array(ranges).shape == (2, d) and np.all(np.array(ranges)[0] < np.array(ranges)[1]), key
    mlm = Manifest.read(version_dir(st_repo, MLM_MODEL)).tasks.embed  # no sentence-transformers config
    assert (mlm.dimensions, mlm.prompts, mlm.default_prompt_name) == ([], {}, None)
    assert sorted(mlm.calibration_ranges) == [f"{HIDDEN}:normalized", f"{HIDDEN}:raw"]


def _st_vectors(st_model_dir, texts, d, normalized) -> np.ndarray:
    """sentence-transformers' vectors: Transformer + Pooling (the pooled vector), truncate_dim d, then its
    normalize_embeddings (cut, then L2)."""
    from sentence_transformers import SentenceTransformer

    full = SentenceTransformer(str(st_model_dir), device="cpu")
    pooled = SentenceTransformer(modules=[full[0], full[1]], device="cpu")
    return pooled.encode(texts, truncate_dim=d, normalize_embeddings=normalized, batch_size=64, prompt="")


def test_calibration_ranges_are_quantize_embeddings_ranges_of_the_corpus(st_repo, st_model_dir):
    """The ranges are the stacked min and max of the corpus's vectors (cut, then normalized or not), the
    ranges quantize_embeddings derives from calibration_embeddings; those vectors are sentence-transformers'
    embeddings of the corpus (no prompt) within 1e-5."""
    from sentence_transformers.util.quantization import quantize_embeddings

    directory = version_dir(st_repo, ST_MODEL)
    manifest = Manifest.read(directory)
    texts = calibration.calibration_texts()
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    ours = calibration.embed_texts(
        directory / "encoder.onnx", tokenizer, manifest.tokenizer.pad_token_id, texts
    )
    for key, stored in manifest.tasks.embed.calibration_ranges.items():
        d, kind = key.split(":")
        vectors = calibration.cut(ours, int(d), kind == "normalized")
        reference = _st_vectors(st_model_dir, texts, int(d), kind == "normalized")
        np.testing.assert_allclose(vectors, reference, atol=ST_TOLERANCE, rtol=0)
        ranges = np.array(stored, dtype=np.float32)
        assert np.array_equal(ranges, np.vstack((vectors.min(axis=0), vectors.max(axis=0)))), key
        for precision in ("int8", "uint8"):
            expected = quantize_embeddings(vectors, precision, calibration_embeddings=vectors)
            assert np.array_equal(quantize_embeddings(vectors, precision, ranges=ranges), expected), key


def test_dimensions_flag_overrides_and_an_equal_export_gives_identical_ranges(
    st_repo, st_model_dir, tmp_path
):
    again, other = tmp_path / "again", tmp_path / "other"
    assert export(st_model_dir, again, "--dimensions", "16, 8") == 0  # the config's, reordered
    first, second = embed_task(st_repo, ST_MODEL), embed_task(again)
    assert second == first  # dimensions, prompts and the calibration ranges, float for float
    assert export(st_model_dir, other, "--dimensions", "24,4,24") == 0
    embed = embed_task(other)
    assert embed.dimensions == [4, 24] and embed.prompts == PROMPTS
    assert sorted(embed.calibration_ranges) == sorted(
        f"{d}:{k}" for d in (4, 24, HIDDEN) for k in ("normalized", "raw")
    )
    for key in (f"{HIDDEN}:normalized", f"{HIDDEN}:raw"):
        assert embed.calibration_ranges[key] == first.calibration_ranges[key]


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("48", "--dimensions: 48 is outside 1..47 (the hidden size 48 is the full vector)"),
        ("8,0", "--dimensions: 0 is outside 1..47"),
        ("8,x", "--dimensions: '8,x' is not a comma-separated list of integers"),
        ("", "--dimensions: '' is not a comma-separated list of integers"),
        (",".join(map(str, range(1, 34))), "--dimensions: 33 sizes (at most 32)"),
    ],
)
def test_bad_dimensions_flag_is_refused(st_model_dir, tmp_path, capsys, flag, message):
    capsys.readouterr()
    assert export(st_model_dir, tmp_path / "repo", "--dimensions", flag) == 1
    err = capsys.readouterr().err
    assert f"bertserve export: error: {message}" in err and "nothing was written" in err
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"matryoshka_dimensions": [8, 100]}, "matryoshka_dimensions: 100 is outside 1..47"),
        ({"matryoshka_dimensions": 8}, "matryoshka_dimensions: a list of integers is required, got 8"),
        ({"matryoshka_dimensions": [8.5]}, "matryoshka_dimensions: 8.5 is not an integer"),
        (
            {"default_prompt_name": "qa"},
            "default_prompt_name 'qa' is not one of its prompts ['document', 'query']",
        ),
        ({"prompts": ["query: "]}, "prompts must be an object of name -> text, got ['query: ']"),
        ({"prompts": {"query": 3}, "default_prompt_name": None}, "prompt 'query' must be a non-empty name"),
        ({"prompts": {"long": "x" * 4097}, "default_prompt_name": None}, "prompt 'long' must be a non-empty"),
        (
            {"prompts": {f"p{i}": "" for i in range(65)}, "default_prompt_name": None},
            "65 prompts (at most 64)",
        ),
    ],
)
def test_bad_sentence_transformers_config_is_refused(st_model_dir, tmp_path, capsys, changes, message):
    directory = edited_copy(st_model_dir, tmp_path, **changes)
    capsys.readouterr()
    assert export(directory, tmp_path / "repo") == 1
    err = capsys.readouterr().err
    assert message in err and str(directory / ST_CONFIG) in err, err
    assert "nothing was written" in err


def test_a_pooling_without_the_prompt_is_refused_with_prompts(st_model_dir, tmp_path, capsys):
    directory = shutil.copytree(st_model_dir, tmp_path / "instructor")
    pooling = directory / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({**json.loads(pooling.read_text()), "include_prompt": False}))
    capsys.readouterr()
    assert export(directory, tmp_path / "repo") == 1
    assert "include_prompt false" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("pooling", "expected"),
    [
        ({"pooling_mode": "cls"}, "cls"),
        ({"pooling_mode": ["mean"]}, "mean"),
        ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "cls"),  # before 6.x
        ({"pooling_mode_mean_tokens": True}, "mean"),
        ({"pooling_mode": ["mean", "max"]}, None),
        ({"pooling_mode": "max"}, None),
        ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}, None),
    ],
)
def test_pooling_of_both_sentence_transformers_layouts(st_model_dir, tmp_path, pooling, expected):
    directory = shutil.copytree(st_model_dir, tmp_path / "pooling")
    (directory / "1_Pooling" / "config.json").write_text(
        json.dumps({"embedding_dimension": HIDDEN, **pooling})
    )
    if expected is None:
        with pytest.raises(CheckpointError, match="is not supported"):
            read_embedding_defaults(directory, 72)
    else:
        defaults = read_embedding_defaults(directory, 72)
        assert (defaults.pooling, defaults.normalize, defaults.max_length) == (expected, True, MAX_SEQ_LENGTH)


def test_a_head_only_model_takes_its_encoders_options(st_repo, st_model_dir, tmp_path, capsys):
    """A fill-mask head on tiny-st's encoder: its embed task is the encoder model's, ranges included."""
    repo = shutil.copytree(st_repo, tmp_path / "repo")
    head = make_checkpoint(
        tmp_path / "head", "BertForMaskedLM", seed=3, encoder_from=st_model_dir, tokenizer=False
    )
    for file in ("tokenizer.json", "tokenizer_config.json"):  # as sentence-transformers saved them
        shutil.copy(st_model_dir / file, head / file)
    # a sentence-transformers directory (as the encoder's: normalized, max length 64)
    normalize = {"type": "sentence_transformers.models.Normalize", "path": "2_Normalize"}
    (head / "modules.json").write_text(json.dumps([normalize]))
    (head / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ_LENGTH}))
    argv = ["export", "--checkpoint", str(head), "--out", str(repo), "--name", "head", "--encoder", ST_MODEL]
    assert main(argv) == 0
    assert embed_task(repo, "head") == embed_task(repo, ST_MODEL)
    assert main([*argv, "--dimensions", "8"]) == 1
    capsys.readouterr()
    (head / ST_CONFIG).write_text(json.dumps({"prompts": {"q": "q: "}}))  # not the encoder's
    assert main(argv) == 1
    assert "does not match encoder tiny-st:1 in embed task" in capsys.readouterr().err


def test_default_model_exports_with_calibration_ranges(default_repo):
    """all-MiniLM-L6-v2's sentence-transformers config declares neither prompts nor Matryoshka sizes."""
    manifest = Manifest.read(default_repo / DEFAULT_MODEL_NAME / "1")
    embed = manifest.tasks.embed
    assert (embed.dimension, embed.dimensions, embed.prompts, embed.default_prompt_name) == (
        384,
        [],
        {},
        None,
    )
    assert sorted(embed.calibration_ranges) == ["384:normalized", "384:raw"]
    assert embed.calibration_texts == len(calibration.calibration_texts())
    assert "calibrate" in manifest.export.seconds


def test_the_limits_themselves_are_accepted(st_model_dir, tmp_path):
    assert check_dimensions(list(range(1, 33)), HIDDEN, "--dimensions") == tuple(range(1, 33))
    prompts = {f"p{i}": "x" * 4096 for i in range(64)}
    directory = edited_copy(st_model_dir, tmp_path, prompts=prompts, default_prompt_name="p63")
    options = read_embedding_options(directory, HIDDEN)
    assert options.prompts == prompts and options.default_prompt_name == "p63"
    assert options.dimensions == tuple(MATRYOSHKA_DIMENSIONS)
