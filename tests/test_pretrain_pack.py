"""`bertserve pack-pretrained` and the default fill-mask model built from the packed weights.

A tiny random checkpoint pretrained in two chained stages through the CLI, then packed: only the tensors
that differ from the base are kept, in float16, with both stages' records; the chain and the held-out text
are checked; `bertserve export` records what the model shares with its base. Then the committed weights:
smaller than 25 MB, better than the WordNet head, and served by `bertserve export-default-heads`."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.test_pretrain import PRETRAIN_ARGS, TEXTS, needs_wordnet


@pytest.fixture(scope="module")
def stages(make_tiny_checkpoint, tmp_path_factory):
    """Stage 1 from the tiny base, stage 2 from stage 1's checkpoint (layer 1 and the head train in both)."""
    from bertserve.cli import main

    base = make_tiny_checkpoint("BertModel")
    work = tmp_path_factory.mktemp("pack")
    text = work / "text.txt"
    text.write_text("\n".join(TEXTS) + "\n")
    start = base
    for name in ("one", "two"):
        args = ["pretrain", "--checkpoint", str(start), "--text", str(text), *PRETRAIN_ARGS]
        assert main([*args, "--out", str(work / name)]) == 0
        start = work / name / "checkpoint"
    return base, work, text


def _pack(base, work, text, *stage_names, out="packed", data=None):
    from bertserve.cli import main

    data = ["--text", str(text)] if data is None else data
    stage_dirs = [str(work / name) for name in stage_names]
    return main(["pack-pretrained", *stage_dirs, "--checkpoint", str(base), *data, "--out", str(work / out)])


def test_pack_keeps_what_differs_from_the_base_in_float16(stages):
    base, work, text = stages
    assert _pack(base, work, text, "one", "two") == 0
    packed = load_file(str(work / "packed" / "trained.safetensors"))
    final = load_file(str(work / "two" / "checkpoint" / "model.safetensors"))
    assert set(packed) == {k for k in final if k.startswith(("bert.encoder.layer.1.", "cls.predictions."))}
    assert all(t.dtype == torch.float16 for t in packed.values())
    assert all(torch.equal(packed[k], final[k].half()) for k in packed)
    record = json.loads((work / "packed" / "pretrain.json").read_text())
    own = [json.loads((work / n / "pretrain.json").read_text()) for n in ("one", "two")]
    assert [s["recipe"] for s in record["stages"]] == [r["recipe"] for r in own]
    assert record["shared_with_base"] == ["bert.embeddings", "bert.encoder.layer.0"]
    # measured again on the float16 tensors: the same held-out masks, figures within rounding of stage two's
    after, last = record["held_out"]["after"], own[1]["held_out"]["after"]
    assert after["masks"] == last["masks"] > 0
    assert abs(after["top1"] - last["top1"]) <= 0.05 and abs(after["top5"] - last["top5"]) <= 0.05


def test_pack_refuses_a_broken_chain_an_unfinished_stage_and_other_text(stages, tmp_path):
    base, work, text = stages
    assert _pack(base, work, text, "two", out="skipped-one") == 1  # stage two did not start from the base
    assert _pack(base, work, text, "one", "one", out="repeated") == 1
    unfinished = tmp_path / "unfinished"
    shutil.copytree(work / "one", unfinished)
    record = json.loads((unfinished / "pretrain.json").read_text())
    record["progress"]["finished"] = False
    (unfinished / "pretrain.json").write_text(json.dumps(record))
    assert _pack(base, tmp_path, text, "unfinished", out="partial") == 1
    other = tmp_path / "other.txt"
    other.write_text("\n".join(reversed(TEXTS)) + "\n")
    assert _pack(base, work, text, "one", "two", out="other-text", data=["--text", str(other)]) == 1
    assert not (work / "skipped-one" / "trained.safetensors").exists()


def test_a_chain_continues_from_an_earlier_pack_assembled(stages, tmp_path):
    """Stage one packed, assembled, and trained on as stage three: packed with --continues, the record
    lists both stages and where the chain was packed; without it (or continuing another pack) refused."""
    from bertserve.cli import main

    base, work, text = stages
    assert _pack(base, work, text, "one", out="packed-one") == 0
    assemble = ["assemble-pretrained", "--checkpoint", str(base), "--weights", str(work / "packed-one")]
    assert main([*assemble, "--out", str(tmp_path / "assembled")]) == 0
    args = ["pretrain", "--checkpoint", str(tmp_path / "assembled"), "--text", str(text), *PRETRAIN_ARGS]
    assert main([*args, "--out", str(tmp_path / "three")]) == 0
    shutil.copytree(work / "one", tmp_path / "one")
    assert _pack(base, tmp_path, text, "three", out="alone") == 1  # it did not start from the base
    assert _pack(base, tmp_path, text, "one", "three", out="chained") == 1  # nor from stage one itself
    continued = ["--text", str(text), "--continues", str(work / "packed-one")]
    assert _pack(base, tmp_path, text, "three", out="continued", data=continued) == 0
    record = json.loads((tmp_path / "continued" / "pretrain.json").read_text())
    earlier = json.loads((work / "packed-one" / "pretrain.json").read_text())
    own = json.loads((tmp_path / "three" / "pretrain.json").read_text())
    assert [s["base"] for s in record["stages"]] == [earlier["stages"][0]["base"], own["base"]]
    assert record["continues"]["after_stage"] == 1 and record["continues"]["dtype"] == "float16"
    assert record["continues"]["assembled_model_sha256"] == own["base"]["model_sha256"]
    assert record["held_out"]["after"]["masks"] == own["held_out"]["after"]["masks"]
    if not (work / "packed" / "pretrain.json").is_file():
        assert _pack(base, work, text, "one", "two") == 0
    heads = tmp_path / "heads" / "heads.json"  # train-heads' record gains a summary, nothing else changes
    heads.parent.mkdir()
    heads.write_text(json.dumps({"fill_mask": {"held_out": {"top1": 0.1}}, "files": {}}))
    summarized = [*continued, "--heads-json", str(heads)]
    assert _pack(base, tmp_path, text, "three", out="continued", data=summarized) == 0
    summary = json.loads(heads.read_text())
    assert summary["fill_mask"] == {"held_out": {"top1": 0.1}} and summary["files"] == {}
    summary = summary["fill_mask_pretraining"]
    assert (
        summary["record"] == "../continued/pretrain.json"
        and summary["held_out"] == record["held_out"]["after"]
    )
    assert summary["trained_sha256"] == record["files"]["trained.safetensors"]["sha256"]
    assert [s["steps"] for s in summary["stages"]] == [s["recipe"]["steps"] for s in record["stages"]]
    other = ["--text", str(text), "--continues", str(work / "packed")]  # stages one and two, not one
    assert _pack(base, tmp_path, text, "three", out="other-pack", data=other) == 1


def test_pack_refuses_weights_float16_cannot_hold(stages, tmp_path):
    from safetensors.torch import save_file

    base, work, text = stages
    shutil.copytree(work / "one", tmp_path / "huge")
    path = tmp_path / "huge" / "checkpoint" / "model.safetensors"
    state = load_file(str(path))
    name = next(k for k in state if k.startswith("bert.encoder.layer.1.") and k.endswith(".weight"))
    state[name] = state[name].clone()
    state[name].view(-1)[0] = 1e6  # beyond float16's 65504
    save_file(state, str(path), metadata={"format": "pt"})
    assert _pack(base, tmp_path, text, "huge", out="packed16") == 1
    data = ["--text", str(text), "--dtype", "float32"]
    assert _pack(base, tmp_path, text, "huge", out="packed32", data=data) == 0


def test_export_records_what_the_packed_model_shares_with_its_base(stages, tmp_path):
    from bertserve.cli import main
    from bertserve.manifest import Manifest

    base, work, text = stages
    if not (work / "packed" / "pretrain.json").is_file():
        assert _pack(base, work, text, "one", "two") == 0
    args = ["assemble-pretrained", "--checkpoint", str(base), "--weights", str(work / "packed")]
    assert main([*args, "--out", str(tmp_path / "assembled")]) == 0
    assert (
        main(
            [
                "export",
                "--checkpoint",
                str(tmp_path / "assembled"),
                "--name",
                "packed",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    info = Manifest.read(tmp_path / "packed" / "1").export.pretraining
    record = json.loads((work / "packed" / "pretrain.json").read_text())
    assert info is not None and info.stages == 2 and info.steps == 2 * 30
    assert info.shared_with_base == ["bert.embeddings", "bert.encoder.layer.0"]
    assert info.held_out["top1"] == record["held_out"]["after"]["top1"]


def test_committed_weights_are_small_packed_and_better_than_the_wordnet_head():
    """export/pretrain/weights: measured on train-heads' held-out masks, its chain starting at MiniLM."""
    from bertserve.export.default_model import default_checkpoint_dir
    from bertserve.export.heads.assemble import COMMITTED_HEADS_DIR, read_heads_record
    from bertserve.export.pretrain.output import COMMITTED_DIR, RECORD_FILE
    from bertserve.manifest import sha256_file

    record = json.loads((COMMITTED_DIR / RECORD_FILE).read_text())
    heads = read_heads_record()["fill_mask"]["held_out"]
    after = record["held_out"]["after"]
    assert (after["texts"], after["masks"]) == (heads["texts"], heads["masks"])
    assert after["top1"] > heads["top1"] and after["top5"] > heads["top5"]
    assert record["dtype"] == "float16" and all(s["data"]["wordnet"] for s in record["stages"])
    assert record["base"]["model_sha256"] == sha256_file(default_checkpoint_dir() / "model.safetensors")
    assert record["shared_with_base"][0] == "bert.embeddings"  # the word table: MiniLM's
    assert record["files"]["trained.safetensors"]["size_bytes"] <= 25 * 2**20
    assert (
        sha256_file(COMMITTED_DIR / "trained.safetensors") == record["files"]["trained.safetensors"]["sha256"]
    )
    summary = read_heads_record()["fill_mask_pretraining"]  # heads.json's summary is this record's
    assert summary["trained_sha256"] == record["files"]["trained.safetensors"]["sha256"]
    assert summary["held_out"] == after and len(summary["stages"]) == len(record["stages"])
    assert (COMMITTED_HEADS_DIR / summary["record"]).resolve() == (COMMITTED_DIR / RECORD_FILE).resolve()


@needs_wordnet
def test_default_heads_export_and_the_fill_mask_model_answers_everyday_sentences(default_repo, tmp_path):
    """`bertserve export-default-heads` beside the exported encoder: the classifier head-only on it, the
    pretrained fill-mask a model of its own; a real server answers a sentence the README shows."""
    from bertserve.cli import main
    from bertserve.client import Client
    from bertserve.manifest import Manifest
    from tests.helpers.server import ServerThread

    repo = tmp_path / "repo"
    shutil.copytree(default_repo, repo)
    assert main(["export-default-heads", "--out", str(repo)]) == 0
    classifier = Manifest.read(repo / "wordnet-noun-category" / "1")
    fill_mask = Manifest.read(repo / "wordnet-fill-mask" / "1")
    assert classifier.encoder is not None and classifier.encoder.name == "all-minilm-l6-v2"
    assert fill_mask.encoder is None and fill_mask.export.pretraining is not None
    assert main(["export-default-heads", "--out", str(repo)]) == 0  # present: left as they are
    assert sorted(p.name for p in (repo / "wordnet-fill-mask").iterdir()) == ["1"]
    with ServerThread(model_repo=repo) as server, Client(server.address, timeout=60) as client:
        response = client.fill_mask(["paris is the [MASK] of france."], model="wordnet-fill-mask", top_k=5)
    (mask,) = response.results[0].masks
    assert "capital" in [c.token for c in mask.candidates]


def test_make_pretrain_fill_mask_is_the_committed_recipe():
    """The one command that reproduces the committed weights runs exactly the stages pretrain.json records,
    packs them into export/pretrain/weights, and continues a chain from the pack it assembled."""
    import shlex
    import subprocess
    from pathlib import Path

    from bertserve.cli import build_parser
    from bertserve.export.heads.assemble import COMMITTED_HEADS_DIR, HEADS_JSON
    from bertserve.export.pretrain.output import COMMITTED_DIR, RECORD_FILE
    from bertserve.train.pretrain.model_setup import LayerRange

    root = Path(__file__).resolve().parent.parent
    dry = subprocess.run(
        ["make", "-n", "-C", str(root), "pretrain-fill-mask"], capture_output=True, text=True, check=True
    ).stdout.replace("\\\n", " ")
    parser = build_parser("bertserve.train.pretrain.commands")
    commands: dict[str, list] = {"pretrain": [], "pack-pretrained": [], "assemble-pretrained": []}
    for line in dry.splitlines():
        if "bertserve" not in line:  # e.g. setup's recipe, printed when .venv is older than pyproject.toml
            continue
        words = shlex.split(line)
        if not any(w.endswith("bertserve") for w in words):
            continue
        for name, parsed in commands.items():
            if name in words:
                parsed.append(parser.parse_args(words[words.index(name) :]))
    runs, packs = commands["pretrain"], commands["pack-pretrained"]
    record = json.loads((COMMITTED_DIR / RECORD_FILE).read_text())
    stages = record["stages"]
    assert len(runs) == len(stages) and runs[0].default and all(r.wordnet for r in runs)
    for run, stage in zip(runs, stages, strict=True):
        layers = LayerRange.parse(run.train_layers, 6)
        made = [run.steps, run.batch_size, run.learning_rate, run.warmup_steps, run.seed, run.threads]
        recipe = stage["recipe"]
        recorded = [
            recipe[k] for k in ("steps", "batch_size", "learning_rate", "warmup_steps", "seed", "threads")
        ]
        assert made == recorded and [layers.start, layers.stop] == recipe["layers"]
    final = packs[-1]
    assert Path(final.out) == COMMITTED_DIR.relative_to(root) and final.wordnet
    assert Path(final.heads_json) == (COMMITTED_HEADS_DIR / HEADS_JSON).relative_to(root)
    after = record["continues"]["after_stage"] if "continues" in record else 0
    assert final.stages == [run.out for run in runs[after:]]
    if after:  # the earlier pack of the first stages, assembled: where the rest started
        earlier = next(p for p in packs if p.out == final.continues)
        assert earlier.stages == [run.out for run in runs[:after]] and earlier.wordnet
        assembled = next(a for a in commands["assemble-pretrained"] if a.weights == earlier.out)
        assert runs[after].checkpoint == assembled.out
    else:
        assert final.continues is None
