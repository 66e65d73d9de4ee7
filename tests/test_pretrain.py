"""`bertserve pretrain` (train/pretrain): BERT's masking, measured on large seeded samples; a tiny random
checkpoint pretrained for a few steps through the CLI: the loss goes down, the run is deterministic, a
resumed run ends bit-identical to an uninterrupted one, the frozen layers are untouched, and `bertserve
export` takes the result, whose FillMask answers through a real server match the checkpoint's own top-5."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertserve.train.heads.wordnet import wordnet_dir
from bertserve.train.pretrain.masking import IGNORE, KEPT, MASKED, RANDOM, MaskingScheme, mask_one

needs_wordnet = pytest.mark.skipif(
    not (wordnet_dir() / "data.noun").is_file(),
    reason="WordNet not installed (Debian: apt-get install wordnet-base)",
)
MASK_ID = 4
RANDOM_IDS = np.arange(5, 777)


def synthetic_texts(count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Texts of 1-3-piece words between [CLS] and [SEP] (word id -1)."""
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(count):
        pieces = rng.integers(1, 4, size=int(rng.integers(5, 40)))  # pieces per word
        word_ids = np.concatenate([[-1], np.repeat(np.arange(len(pieces)), pieces), [-1]])
        ids = rng.integers(5, 777, size=len(word_ids))
        ids[0], ids[-1] = 2, 3
        texts.append((ids, word_ids))
    return texts


def within(observed: int, total: int, p: float) -> bool:
    """observed/total is within 5 binomial standard deviations of p."""
    return abs(observed - p * total) <= 5 * np.sqrt(total * p * (1 - p))


@pytest.mark.parametrize("whole_word", [False, True], ids=["per-token", "whole-word"])
def test_masking_chooses_15_percent_then_80_10_10(whole_word):
    scheme = MaskingScheme(whole_word=whole_word)
    rng = np.random.default_rng(0)
    units = chosen = 0
    fates = {KEPT: 0, MASKED: 0, RANDOM: 0}
    replaced_differs = replaced = 0
    for ids, word_ids in synthetic_texts(2000, seed=1):
        corrupted, labels, fate = mask_one(ids, word_ids, scheme, rng, MASK_ID, RANDOM_IDS)
        special = word_ids < 0
        assert (fate[special] == -1).all() and (corrupted[special] == ids[special]).all()
        assert ((labels == IGNORE) == (fate == -1)).all() and (labels[fate >= 0] == ids[fate >= 0]).all()
        assert (corrupted[fate == -1] == ids[fate == -1]).all() and (
            corrupted[fate == KEPT] == ids[fate == KEPT]
        ).all()
        assert (corrupted[fate == MASKED] == MASK_ID).all()
        assert np.isin(corrupted[fate == RANDOM], RANDOM_IDS).all()
        replaced += int((fate == RANDOM).sum())
        replaced_differs += int((corrupted[fate == RANDOM] != ids[fate == RANDOM]).sum())
        inner = word_ids >= 0
        same_word = inner[1:] & (word_ids[1:] == word_ids[:-1])
        if whole_word:  # every piece of a word shares its word's fate
            assert (fate[1:][same_word] == fate[:-1][same_word]).all()
            starts = np.flatnonzero(inner & np.concatenate([[True], ~same_word]))
            unit_fates = fate[starts]
        else:
            unit_fates = fate[inner]
        units += len(unit_fates)
        chosen += int((unit_fates >= 0).sum())
        for f in fates:
            fates[f] += int((unit_fates == f).sum())
    assert units > 20_000
    assert within(chosen, units, 0.15), chosen / units
    assert within(fates[MASKED], chosen, 0.8), fates[MASKED] / chosen
    assert within(fates[RANDOM], chosen, 0.1), fates[RANDOM] / chosen
    assert within(fates[KEPT], chosen, 0.1), fates[KEPT] / chosen
    assert replaced_differs > 0.99 * replaced  # random means random: rarely the original token


def test_masking_is_a_function_of_the_seed():
    ids, word_ids = synthetic_texts(1, seed=3)[0]
    runs = [
        mask_one(ids, word_ids, MaskingScheme(), np.random.default_rng(7), MASK_ID, RANDOM_IDS)
        for _ in range(2)
    ]
    assert all(np.array_equal(a, b) for a, b in zip(*runs, strict=True))


# A small corpus, repeated: 24 distinct sentences over the tiny vocabulary's words.
SUBJECTS, VERBS, OBJECTS = (
    ["the cat", "the dog", "a cat", "a dog"],
    ["sat on", "is in"],
    ["the mat", "paris", "the capital"],
)
TEXTS = [f"{s} {v} {o} ." for s in SUBJECTS for v in VERBS for o in OBJECTS] * 12
# Layer 0 and the embeddings stay frozen; layer 1 and the MLM head train.
RECIPE = {"--steps": 30, "--batch-size": 16, "--warmup-steps": 4, "--learning-rate": 5e-3, "--seed": 5}
PRETRAIN_ARGS = [str(v) for item in RECIPE.items() for v in item] + [
    "--train-layers",
    "1:",
    "--save-every",
    "0",
]


@pytest.fixture(scope="module")
def pretrained(make_tiny_checkpoint, tmp_path_factory):
    """Runs of the CLI: 'a' and 'b' alike, 'resumed' stopped at step 17 then resumed to the end."""
    from bertserve.cli import main

    base = make_tiny_checkpoint("BertModel")
    work = tmp_path_factory.mktemp("pretrain")
    text = work / "text.txt"
    text.write_text("\n".join(TEXTS) + "\n")
    common = ["pretrain", "--checkpoint", str(base), "--text", str(text), *PRETRAIN_ARGS]
    torch_settings = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    for name in ("a", "b"):
        assert main([*common, "--out", str(work / name)]) == 0
    assert main([*common, "--out", str(work / "resumed"), "--stop-after", "13"]) == 0
    stopped = json.loads((work / "resumed" / "pretrain.json").read_text())
    assert stopped["progress"]["steps_done"] == 13 and not stopped["progress"]["finished"]
    assert main([*common, "--out", str(work / "resumed"), "--resume"]) == 0
    assert (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
    ) == torch_settings  # restored
    return base, work


def _record(directory):
    return json.loads((directory / "pretrain.json").read_text())


def test_pretraining_lowers_the_loss_and_beats_the_start(pretrained):
    _, work = pretrained
    record = _record(work / "a")
    curve = [loss for _, loss in record["progress"]["loss_curve"]]
    assert curve[-1] < curve[0] - 0.4, curve  # from ln(vocab) = 6.66 at the start
    held_out = record["held_out"]["after"]
    assert held_out["masks"] > 0 and held_out["top5"] >= held_out["top1"] > 0


def test_pretraining_is_deterministic_and_resumes_exactly(pretrained):
    _, work = pretrained
    a, b, resumed = (_record(work / n) for n in ("a", "b", "resumed"))
    assert a["progress"]["loss_curve"] == b["progress"]["loss_curve"] == resumed["progress"]["loss_curve"]
    digest = a["files"]["trained.safetensors"]["sha256"]
    assert b["files"]["trained.safetensors"]["sha256"] == digest
    assert resumed["progress"]["steps_done"] == 30 and resumed["progress"]["finished"]
    assert (
        resumed["files"]["trained.safetensors"]["sha256"] == digest
    )  # bit-identical to the uninterrupted run
    assert resumed["held_out"]["after"] == a["held_out"]["after"]


def test_frozen_tensors_are_bit_identical_and_trained_ones_moved(pretrained):
    base, work = pretrained
    before = {f"bert.{k}": v for k, v in load_file(str(base / "model.safetensors")).items()}
    after = load_file(str(work / "a" / "checkpoint" / "model.safetensors"))
    trained = set(load_file(str(work / "a" / "trained.safetensors")))
    frozen = [k for k in after if k.startswith(("bert.embeddings.", "bert.encoder.layer.0."))]
    assert frozen and all(torch.equal(after[k], before[k]) for k in frozen)
    assert trained == {k for k in after if k.startswith(("bert.encoder.layer.1.", "cls.predictions."))}
    assert all(not torch.equal(after[k], before[k]) for k in trained if k in before)
    assert _record(work / "a")["shared_with_base"] == ["bert.embeddings", "bert.encoder.layer.0"]


def test_a_different_recipe_does_not_resume(pretrained, tmp_path):
    from bertserve.cli import main

    base, work = pretrained
    args = ["pretrain", "--checkpoint", str(base), "--text", str(work / "text.txt"), *PRETRAIN_ARGS]
    args[args.index("--seed") + 1] = "6"
    shutil.copytree(work / "a", tmp_path / "a")
    assert main([*args, "--out", str(tmp_path / "a"), "--resume"]) == 1


def test_export_takes_the_result_and_fill_mask_answers_like_it(pretrained, tmp_path):
    from bertserve.cli import main
    from bertserve.client import Client
    from bertserve.export.checkpoint import load_checkpoint
    from bertserve.export.tokenizer_files import load_tokenizer
    from tests.helpers.server import ServerThread

    _, work = pretrained
    checkpoint_dir = work / "a" / "checkpoint"
    assert (
        main(
            [
                "export",
                "--checkpoint",
                str(checkpoint_dir),
                "--name",
                "tiny-pretrained",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    checkpoint = load_checkpoint(checkpoint_dir)
    assert checkpoint.architecture == "BertForMaskedLM"
    text = "the cat sat on [MASK] mat ."
    ids = load_tokenizer(checkpoint_dir).encode(text).ids
    with torch.no_grad():
        logits = checkpoint.model(torch.tensor([ids]))[0, ids.index(MASK_ID)]  # (V,)
    expected = logits.topk(5).indices.tolist()
    with ServerThread(model_repo=tmp_path) as server, Client(server.address, timeout=30) as client:
        response = client.fill_mask([text], model="tiny-pretrained", top_k=5)
    (mask,) = response.results[0].masks
    assert [c.token_id for c in mask.candidates] == expected


@needs_wordnet
def test_wordnet_held_out_masks_are_those_of_train_heads():
    """The held-out figures are comparable with heads.json's: same texts, same masks, none trained on."""
    from bertserve.export.default_model import default_checkpoint_dir
    from bertserve.export.heads.assemble import read_heads_record
    from bertserve.export.tokenizer_files import load_tokenizer
    from bertserve.train.pretrain.corpus import read_wordnet
    from bertserve.train.pretrain.evaluate import wordnet_held_out

    masked, targets = wordnet_held_out(load_tokenizer(default_checkpoint_dir()), 103)
    recorded = read_heads_record()["fill_mask"]["held_out"]
    assert (len(masked), len(targets)) == (recorded["texts"], recorded["masks"])
    assert sum(ids.count(103) for ids in masked) == len(targets)
    train, test = read_wordnet()
    assert len(train) > 10 * len(test) and not {t.lower() for t in train} & {t.lower() for t in test}


def test_assemble_rebuilds_the_checkpoint_from_base_and_trained_tensors(
    pretrained, make_tiny_checkpoint, tmp_path
):
    from bertserve.cli import main

    base, work = pretrained
    args = ["assemble-pretrained", "--checkpoint", str(base), "--weights", str(work / "a")]
    assert main([*args, "--out", str(tmp_path / "rebuilt")]) == 0
    rebuilt = load_file(str(tmp_path / "rebuilt" / "model.safetensors"))
    written = load_file(str(work / "a" / "checkpoint" / "model.safetensors"))
    assert rebuilt.keys() == written.keys() and all(torch.equal(rebuilt[k], written[k]) for k in written)
    tampered = tmp_path / "tampered"
    shutil.copytree(work / "a", tampered, ignore=shutil.ignore_patterns("checkpoint", "resume.pt"))
    with open(tampered / "trained.safetensors", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    assert main([*args[:-1], str(tampered), "--out", str(tmp_path / "refused")]) == 1
    other_base = make_tiny_checkpoint("BertModel", seed=1)  # same shapes, other weights
    args[2] = str(other_base)
    assert main([*args, "--out", str(tmp_path / "other")]) == 1
