"""Export of sentence-pair models: the pair template, `--pairs`, CrossEncoder recognition, and parity of the
exported graphs with transformers / sentence-transformers on pair inputs (tests/pair_models.py)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

from bertserve.cli import main
from bertserve.export import onnx_export
from bertserve.export.pipeline import export_model
from bertserve.export.tokenizer_files import pair_template
from bertserve.repository import CLASSIFIER_HEAD, ENCODER, POOLER_OUTPUT, read_manifest
from tests.pair_models import CROSS_ENCODER_MAX_LENGTH, PAIR_EMBED, PAIR_TEMPLATE

FIRSTS = ["the cat sat on the mat", "paris is the capital", "a dog", "word1 word2 word3 " * 30]
SECONDS = ["a dog sat", "of what", "the cat is on the mat and the dog is in paris " * 4, "x"]
TOLERANCE = 1e-4


def run_graphs(model, feed: dict[str, np.ndarray]) -> np.ndarray:
    """The exported encoder then classifier_head, as the server chains them (pooler_output -> logits)."""
    manifest = model.manifest
    options = ort.SessionOptions()
    options.log_severity_level = 3

    def session(key):
        return ort.InferenceSession(str(model.directory / manifest.graphs[key].file), options)

    pooled = session(ENCODER).run([POOLER_OUTPUT], feed)[0]
    return session(CLASSIFIER_HEAD).run(None, {POOLER_OUTPUT: pooled})[0]


def random_pair_feed(rng, rows: int, length: int, vocab: int) -> dict[str, np.ndarray]:
    """[CLS] a [SEP] b [SEP] of random ids (segment ids 0 then 1), rows padded to random lengths."""
    feed = {
        k: np.zeros((rows, length), dtype=np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")
    }
    for row in range(rows):
        n = length if row == 0 else int(rng.integers(5, length + 1))
        first = int(rng.integers(1, n - 3))
        feed["input_ids"][row, :n] = [
            2,
            *rng.integers(5, vocab, first),
            3,
            *rng.integers(5, vocab, n - 3 - first),
            3,
        ]
        feed["attention_mask"][row, :n] = 1
        feed["token_type_ids"][row, first + 2 : n] = 1
    return feed


@pytest.mark.parametrize("which", ["tiny_pair_classifier", "tiny_cross_encoder"])
def test_exported_graphs_match_transformers_on_random_pairs(which, request):
    model = request.getfixturevalue(which)
    vocab = model.manifest.dimensions.vocab_size
    rng = np.random.default_rng(5)
    for rows, length in [(1, 7), (5, 23), (8, model.max_length)]:
        feed = random_pair_feed(rng, rows, length, vocab)
        got, expected = run_graphs(model, feed), model.logits_of(feed)
        assert got.shape == expected.shape == (rows, len(model.manifest.tasks.classify.id2label))
        np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)
    # the segment ids matter to these models: all-zero segment ids give other logits
    zeros = {**feed, "token_type_ids": np.zeros_like(feed["token_type_ids"])}
    assert np.abs(run_graphs(model, zeros) - expected).max() > 100 * TOLERANCE


@pytest.mark.parametrize("which", ["tiny_pair_classifier", "tiny_cross_encoder"])
def test_exported_graphs_match_transformers_on_tokenized_pairs(which, request):
    model = request.getfixturevalue(which)
    feed = model.encode_pairs(FIRSTS, SECONDS)
    assert feed["input_ids"].shape[1] == model.max_length  # the long pairs were cut
    assert set(np.unique(feed["token_type_ids"])) == {0, 1}
    got = run_graphs(model, feed)
    np.testing.assert_allclose(got, model.expected_logits(FIRSTS, SECONDS), atol=TOLERANCE, rtol=0)


def test_cross_encoder_graphs_match_cross_encoder_predict(tiny_cross_encoder):
    """sigmoid(exported logit) == CrossEncoder.predict, which tokenizes at its own max_length."""
    spec = tiny_cross_encoder.manifest.tasks.classify.cross_encoder
    assert spec.activation == "sigmoid"
    feed = tiny_cross_encoder.encode_pairs(FIRSTS, SECONDS)
    logits = run_graphs(tiny_cross_encoder, feed)[:, 0].astype(np.float64)
    scores = 1.0 / (1.0 + np.exp(-logits))
    expected = tiny_cross_encoder.expected_scores(list(zip(FIRSTS, SECONDS, strict=True)))
    np.testing.assert_allclose(scores, expected, atol=TOLERANCE, rtol=0)


def test_pair_manifests(pair_repo, tiny_pair_classifier, tiny_cross_encoder):
    classifier = tiny_pair_classifier.manifest
    assert classifier.tokenizer.pair_template == PAIR_TEMPLATE  # BertProcessing in its tokenizer.json
    assert classifier.tasks.classify.pairs is True
    assert classifier.tasks.classify.cross_encoder is None
    assert len(classifier.tasks.classify.id2label) == 3
    assert classifier.max_length == 72  # its position embeddings

    cross = tiny_cross_encoder.manifest
    assert cross.tokenizer.pair_template == PAIR_TEMPLATE  # TemplateProcessing, as transformers saves it
    assert cross.tasks.classify.pairs is True
    assert cross.tasks.classify.cross_encoder.model_dump() == {
        "activation": "sigmoid",
        "max_length": CROSS_ENCODER_MAX_LENGTH,
        "fusion": None,  # its scores are its own (a fused one: tests/test_pairs_fused.py)
    }
    assert cross.max_length == CROSS_ENCODER_MAX_LENGTH == tiny_cross_encoder.cross_encoder().max_seq_length
    assert cross.tasks.embed.normalize is True  # its modules.json has no Normalize: that is not an embedder's

    embed = read_manifest(pair_repo / PAIR_EMBED / "1")
    assert embed.tasks.classify is None and embed.tasks.embed is not None
    assert embed.tokenizer.pair_template == PAIR_TEMPLATE


def test_exported_tokenizer_joins_pairs_as_transformers_does(tiny_pair_classifier, tiny_cross_encoder):
    """The repository's tokenizer.json (what the server loads) cuts pairs at the manifest's max_length."""
    for model in (tiny_pair_classifier, tiny_cross_encoder):
        tokenizer = Tokenizer.from_file(str(model.directory / "tokenizer.json"))
        expected = model.hf_tokenizer()(FIRSTS, SECONDS, truncation=True, max_length=model.max_length)
        for i, encoding in enumerate(tokenizer.encode_batch(list(zip(FIRSTS, SECONDS, strict=True)))):
            assert encoding.ids == expected["input_ids"][i]
            assert encoding.type_ids == expected["token_type_ids"][i]


def test_pair_template_of_post_processors(tmp_path):
    from tokenizers import processors

    from tests.helpers.checkpoints import write_tokenizer

    write_tokenizer(tmp_path, 777)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert pair_template(tokenizer) == PAIR_TEMPLATE  # BertProcessing
    template = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tokenizer.post_processor = processors.Sequence([processors.ByteLevel(), template])
    assert pair_template(tokenizer) == "[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1 [SEP]:1"
    tokenizer.post_processor = None
    assert pair_template(tokenizer) is None


@pytest.mark.parametrize("kind", ["BertModel", "BertForMaskedLM"])
def test_pairs_refused_without_a_classify_head(kind, tmp_path, make_tiny_checkpoint, capsys):
    checkpoint, repo = make_tiny_checkpoint(kind), tmp_path / "repo"
    capsys.readouterr()  # transformers' progress bars while the checkpoint was written
    code = main(["export", "--checkpoint", str(checkpoint), "--out", str(repo), "--pairs"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert lines[0].startswith("bertserve export: error: --pairs") and f"is a {kind} checkpoint" in lines[0]
    assert lines[1:] == ["nothing was written"]
    assert not repo.exists() or not any(repo.iterdir())


def test_pair_check_refuses_a_graph_that_drops_segment_ids(
    tiny_pair_classifier, tmp_path, monkeypatch, capsys
):
    """An encoder graph traced from a module that ignores token_type_ids matches that module (the per-graph
    check passes) but not the classifier on pairs: the export fails and writes nothing."""
    real_forward = onnx_export.EncoderGraph.forward

    def without_segments(self, input_ids, attention_mask, token_type_ids):
        return real_forward(self, input_ids, attention_mask, torch.zeros_like(token_type_ids))

    monkeypatch.setattr(onnx_export.EncoderGraph, "forward", without_segments)
    repo = tmp_path / "repo"
    code = main(
        ["export", "--checkpoint", str(tiny_pair_classifier.checkpoint), "--out", str(repo), "--pairs"]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    assert "logits on sentence pairs (segment ids 0 then 1) differ from PyTorch" in err
    assert "Traceback" not in err and (not repo.exists() or not any(repo.iterdir()))


def test_head_only_pair_classifier(tmp_path, make_tiny_checkpoint):
    """--pairs with --encoder: the pair check runs the shared encoder's graph, then the head-only model's head."""
    base = make_tiny_checkpoint("BertModel")
    head = make_tiny_checkpoint("BertForSequenceClassification", seed=1, encoder_from=base)
    repo = tmp_path / "repo"
    quiet = dict(log=lambda _: None)
    export_model(base, repo, name="encoder", version=1, **quiet)
    pairs = export_model(head, repo, name="pairs", version=1, encoder="encoder", pairs=True, **quiet)
    single = export_model(head, repo, name="single", version=1, encoder="encoder", **quiet)
    assert "verify_pairs" in read_manifest(pairs).export.seconds
    assert read_manifest(pairs).tasks.classify.pairs is True
    assert read_manifest(single).tasks.classify.pairs is False  # not marked without --pairs
    assert read_manifest(pairs).tokenizer.pair_template == PAIR_TEMPLATE
    # an encoder model exported before pair templates were recorded still takes heads: the template is
    # derived from the tokenizer file, whose sha256 is compared
    manifest_file = repo / "encoder" / "1" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["tokenizer"]["pair_template"] = None
    manifest_file.write_text(json.dumps(manifest))
    older = export_model(head, repo, name="older", version=1, encoder="encoder", pairs=True, **quiet)
    assert (
        read_manifest(older).tokenizer.pair_template is None
    )  # a head-only model's tokenizer is its encoder's


def test_one_segment_embedding(tmp_path, make_tiny_checkpoint, capsys):
    """type_vocab_size 1: --pairs is refused (a second text needs segment id 1); without it the classifier
    exports, and its export skips the pair check rather than feed it segment ids it has no embedding for."""
    checkpoint = make_tiny_checkpoint("BertForSequenceClassification", type_vocab_size=1)
    repo = tmp_path / "repo"
    capsys.readouterr()
    assert (
        main(["export", "--checkpoint", str(checkpoint), "--out", str(repo), "--name", "m", "--pairs"]) == 1
    )
    err = capsys.readouterr().err
    assert "error: --pairs: " in err and "has type_vocab_size 1 (pairs need 2)" in err
    written = export_model(checkpoint, repo, name="m", version=1, log=lambda _: None)
    manifest = read_manifest(written)
    assert manifest.tasks.classify.pairs is False and "verify_pairs" not in manifest.export.seconds
