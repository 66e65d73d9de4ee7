"""The sentence-pair models that tests/test_pairs_grpc*.py serve over gRPC: a tiny random pair classifier
(3 labels), a tiny random sentence-transformers CrossEncoder (num_labels 1, written by its `save`) and a tiny
embedding model, each exported with `bertserve export` (once per session: the `grpc_pair_models` fixture
of tests/conftest.py), with the references their answers are compared with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tests.helpers.checkpoints import export_all, make_checkpoint

PAIR_CLASSIFIER, CROSS_ENCODER, EMBED = "tiny-pair-classifier", "tiny-cross-encoder", "tiny-embed"
MAX_INPUTS = 8
TOL = 1e-4
INIT_RANGE = 0.2  # wider than transformers' 0.02: a tiny random model's scores then depend on its inputs
QUERY = "the capital of paris"
DOCUMENTS = ["paris is the capital", "a dog sat on the mat", "the cat", "capital of the dog", "the cat"]
FIRSTS = ["the cat sat on the mat", "a dog", "paris is the capital", "the mat"]
SECONDS = ["a cat is on a mat", "the dog sat", "capital of paris", "to the dog and the cat"]
LONG = " ".join(["the cat sat on the mat"] * 20)  # 120 tokens: over every model's max_length


class Models:
    """The exported repository and the references its models are compared with."""

    def __init__(self, repo: Path, classifier: Path, cross_encoder: Path):
        import transformers
        from sentence_transformers import CrossEncoder

        self.repo = repo
        self.classifier = transformers.BertForSequenceClassification.from_pretrained(
            classifier, attn_implementation="eager"
        ).eval()
        self.tokenizer = transformers.BertTokenizerFast(tokenizer_file=str(classifier / "tokenizer.json"))
        self.cross_encoder = CrossEncoder(str(cross_encoder), device="cpu")
        self.cross_encoder_logits_model = transformers.BertForSequenceClassification.from_pretrained(
            cross_encoder, attn_implementation="eager"
        ).eval()

    def logits(self, model, firsts, seconds, truncation="longest_first", max_length=None) -> np.ndarray:
        batch = self.tokenizer(
            list(firsts), list(seconds), truncation=truncation, max_length=max_length, padding=True,
            return_tensors="pt",
        )  # fmt: skip
        with torch.no_grad():
            return model(**batch).logits.numpy()


def export_models(tmp_path_factory) -> Models:

    scratch = tmp_path_factory.mktemp("pair-checkpoints")
    repo = tmp_path_factory.mktemp("pair-repo")
    from sentence_transformers import CrossEncoder

    classifier = make_checkpoint(
        scratch / "classifier", "BertForSequenceClassification", num_labels=3, seed=11,
        initializer_range=INIT_RANGE,
    )  # fmt: skip
    base = make_checkpoint(
        scratch / "cross-base", "BertForSequenceClassification", num_labels=1, seed=12,
        initializer_range=INIT_RANGE,
    )  # fmt: skip
    cross_encoder = scratch / "cross-encoder"
    CrossEncoder(str(base), device="cpu", num_labels=1).save(str(cross_encoder))
    embed = make_checkpoint(scratch / "embed", "BertModel", seed=13, initializer_range=INIT_RANGE)
    exports = [(PAIR_CLASSIFIER, classifier), (CROSS_ENCODER, cross_encoder), (EMBED, embed)]
    export_all(repo, [(name, checkpoint, []) for name, checkpoint in exports])
    return Models(repo, classifier, cross_encoder)
