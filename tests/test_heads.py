"""Heads trained on WordNet (train/heads; their weights: export/heads): data parsing, a deterministic
retrain of a small subset, the committed head files (checksums, held-out quality on our encoder), and the
assembled checkpoints (load with transformers, match the scratch BERT, export to ONNX and classify through
ONNX Runtime)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertserve.train.heads.wordnet import parse_data_line, split_gloss, split_of, wordnet_dir

needs_wordnet = pytest.mark.skipif(
    not (wordnet_dir() / "data.noun").is_file(),
    reason="WordNet not installed (Debian: apt-get install wordnet-base)",
)

# One line of data.noun (WordNet 3.0), pointers shortened.
DATA_LINE = (
    "02084071 05 n 03 dog 0 domestic_dog 0 Canis_familiaris 0 001 @ 02083346 n 0000 | a member of the "
    'genus Canis (probably descended from the common wolf) that has been domesticated; "the dog barked '
    'all night"  \n'
)
DEFINITIONS = [
    "a large carnivorous feline mammal of Asia having a tawny coat with black stripes",
    "a tall perennial woody plant having a main trunk and branches forming a distinct elevated crown",
    "a hand tool with a heavy rigid head and a handle; used to deliver an impulsive force by striking",
    "a person who is a member of a legislative body",
]


def test_parse_data_line_reads_category_words_definition_and_examples():
    synset = parse_data_line(DATA_LINE)
    assert synset.offset == 2084071 and synset.lexname == "noun.animal"
    assert synset.words == ("dog", "domestic dog", "Canis familiaris")
    assert synset.definition.startswith("a member of the genus Canis") and synset.definition.endswith(
        "domesticated"
    )
    assert synset.examples == ("the dog barked all night",)
    assert parse_data_line("  1 This software and database is being provided\n") is None


def test_split_gloss_keeps_semicolons_inside_examples():
    definition, examples = split_gloss('an easy task; "it was a cakewalk; truly"; "a piece of cake" ')
    assert definition == "an easy task"
    assert examples == ("it was a cakewalk; truly", "a piece of cake")


def test_split_is_deterministic_and_about_ten_percent():
    held_out = [split_of(offset) for offset in range(100_000, 120_000)]
    assert 0.08 < held_out.count("test") / len(held_out) < 0.12
    assert split_of(2084071) == split_of(2084071)


def test_classifier_training_is_deterministic():
    from bertserve.export.model import BertConfig
    from bertserve.train.heads.classifier import ClassifierTraining, head_state, train_classifier_head
    from bertserve.train.heads.training import state_digest

    config = BertConfig(hidden_size=16, num_attention_heads=2)
    x = np.random.default_rng(0).normal(size=(200, 16)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    training = ClassifierTraining(epochs=3, batch_size=32)
    digests = {
        state_digest(head_state(train_classifier_head(config, x, y, 2, None, training, log=lambda _: None)))
        for _ in range(2)
    }
    assert len(digests) == 1


@pytest.fixture(scope="module")
def committed_record():
    from bertserve.export.heads.assemble import COMMITTED_HEADS_DIR, verify_heads

    return verify_heads(COMMITTED_HEADS_DIR)  # raises when a head file's sha256 differs


def test_committed_heads_match_checksums_and_recorded_figures(committed_record):
    classifier, fill_mask = committed_record["classifier"], committed_record["fill_mask"]
    assert len(classifier["labels"]) >= 10
    assert classifier["held_out"]["accuracy"] >= 0.75
    assert fill_mask["held_out"]["top1"] > fill_mask["held_out"]["unigram_top1"]
    assert fill_mask["held_out"]["top5"] > fill_mask["held_out"]["unigram_top5"]


@needs_wordnet
@pytest.mark.timeout(900)  # CPU-bound training: minutes on a machine shared with other work
def test_retraining_a_subset_beats_chance(tmp_path):
    from bertserve.export.default_model import default_checkpoint_dir
    from bertserve.export.heads.assemble import verify_heads
    from bertserve.train.heads.classifier import ClassifierTraining
    from bertserve.train.heads.mlm import MlmTraining
    from bertserve.train.heads.training import HeadsPlan, train_heads

    plan = HeadsPlan(
        synset_stride=100, classifier=ClassifierTraining(epochs=30), mlm=MlmTraining(epochs=3), threads=2
    )
    record = train_heads(tmp_path, default_checkpoint_dir(), "test", plan, log=lambda _: None)
    written = verify_heads(tmp_path / "heads")  # checksums of the files just written
    assert written["classifier"]["held_out"] == record["classifier"]["held_out"]
    held_out = record["classifier"]["held_out"]
    assert held_out["examples"] >= 50
    assert held_out["accuracy"] > 2 * held_out["majority_class_accuracy"]
    assert record["fill_mask"]["held_out"]["top5"] > 0.1
    assert (tmp_path / "checkpoints" / "wordnet-noun-category" / "model.safetensors").is_file()


@pytest.fixture(scope="module")
def assembled(tmp_path_factory, committed_record):
    from bertserve.cli import main

    out = tmp_path_factory.mktemp("assembled-heads")
    assert main(["assemble-heads", "--out", str(out)]) == 0
    return out


def _encode(directory, texts):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)(texts, padding=True, return_tensors="pt")


def test_assembled_classifier_loads_with_transformers_and_matches_scratch(assembled, committed_record):
    from transformers import BertForSequenceClassification

    from bertserve.export.checkpoint import load_checkpoint

    directory = assembled / "wordnet-noun-category"
    reference, info = BertForSequenceClassification.from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert reference.config.id2label[0] == committed_record["classifier"]["labels"][0]
    batch = _encode(directory, DEFINITIONS)
    with torch.no_grad():
        expected = reference.eval()(**batch).logits
        ours = load_checkpoint(directory).model(**batch)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4)
    labels = [reference.config.id2label[i] for i in expected.argmax(-1).tolist()]
    assert labels[:3] == ["noun.animal", "noun.plant", "noun.artifact"]


def test_assembled_fill_mask_loads_with_transformers_and_predicts(assembled):
    from transformers import BertForMaskedLM

    directory = assembled / "wordnet-fill-mask"
    model, info = BertForMaskedLM.from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    batch = _encode(directory, ["a domesticated animal kept as a [MASK] or for hunting"])
    with torch.no_grad():
        logits = model.eval()(**batch).logits  # (1, T, V)
    position = batch["input_ids"][0].tolist().index(103)
    assert torch.isfinite(logits).all()
    assert logits[0, position].argmax() != 103  # predicts a word, not the mask token


def test_assembled_classifier_exports_and_classifies_through_onnx_runtime(assembled, tmp_path):
    import onnxruntime as ort

    from bertserve.export.pipeline import export_model
    from bertserve.manifest import CLASSIFIER_HEAD, ENCODER, Manifest

    version_dir = export_model(
        assembled / "wordnet-noun-category", tmp_path, name="wn", version=1, log=lambda _: None
    )
    manifest = Manifest.read(version_dir)
    assert manifest.tasks.classify is not None and len(manifest.tasks.classify.id2label) >= 10
    batch = {k: v.numpy() for k, v in _encode(assembled / "wordnet-noun-category", DEFINITIONS).items()}
    encoder = ort.InferenceSession(str(version_dir / manifest.graphs[ENCODER].file))
    head = ort.InferenceSession(str(version_dir / manifest.graphs[CLASSIFIER_HEAD].file))
    pooled = encoder.run(["pooler_output"], batch)[0]
    logits = head.run(["logits"], {"pooler_output": pooled})[0]
    labels = [manifest.tasks.classify.id2label[i] for i in logits.argmax(-1).tolist()]
    assert labels[:3] == ["noun.animal", "noun.plant", "noun.artifact"]


@needs_wordnet
def test_assembled_checkpoints_score_on_held_out_synsets(assembled):
    """The committed heads, on our scratch encoder, on every 20th held-out synset (about 400)."""
    from bertserve.export.checkpoint import load_checkpoint
    from bertserve.export.tokenizer_files import load_tokenizer
    from bertserve.train.heads.features import cls_features, masked_features, tokenize
    from bertserve.train.heads.mlm import mask_tokens
    from bertserve.train.heads.wordnet import load_noun_synsets

    held_out = [s for s in load_noun_synsets() if split_of(s.offset) == "test"][::20]
    classifier = load_checkpoint(assembled / "wordnet-noun-category")
    tokenizer = load_tokenizer(assembled / "wordnet-noun-category")
    features = torch.from_numpy(
        cls_features(classifier.encoder, tokenize(tokenizer, [s.definition for s in held_out]))
    )
    with torch.no_grad():
        logits = classifier.model.classifier(classifier.encoder.pooler(features[:, None, :]))  # (N, L)
    predicted = [classifier.config.id2label[i] for i in logits.argmax(-1).tolist()]
    accuracy = np.mean([p == s.lexname for p, s in zip(predicted, held_out, strict=True)])
    assert accuracy >= 0.7, accuracy

    fill_mask = load_checkpoint(assembled / "wordnet-fill-mask")
    masked, targets = mask_tokens(
        tokenize(tokenizer, [s.definition for s in held_out]), 103, np.random.default_rng(1)
    )
    states = torch.from_numpy(masked_features(fill_mask.encoder, masked, 103))
    with torch.no_grad():
        top5 = fill_mask.model.cls(states).topk(5, dim=-1).indices.numpy()  # (M, 5)
    assert (top5 == targets[:, None]).any(axis=1).mean() >= 0.2
