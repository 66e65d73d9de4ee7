"""Tiny random sentence-pair models for tests, exported through `bertserve export`, with their references.

- `make_pair_classifier(directory)`: a random BertForSequenceClassification with 3 labels (as a model
  trained on pairs, e.g. natural-language inference), written by transformers.
- `make_cross_encoder(directory, scratch)`: a sentence-transformers CrossEncoder (num_labels 1, max_length
  CROSS_ENCODER_MAX_LENGTH) on a tiny random BERT checkpoint, written by `CrossEncoder.save`.
- `export_pair_repo(repo, scratch)`: both, plus a tiny embedding model, exported into one repository;
  returns {name: PairModel}.

`PairModel` gives the exported version's directory and manifest, and the reference each test compares
with: transformers' model and tokenizer (`expected_logits`), and for the cross-encoder sentence-transformers'
`CrossEncoder` (`expected_scores` = `CrossEncoder.predict`, its activation applied).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertserve.repository import Manifest, read_manifest
from tests.helpers.checkpoints import export_all, make_checkpoint

PAIR_CLASSIFIER = "tiny-pair-classifier"
CROSS_ENCODER = "tiny-cross-encoder"
PAIR_EMBED = "tiny-embed"
CROSS_ENCODER_MAX_LENGTH = 40  # below the tiny models' 72 position embeddings: the manifest takes it
PAIR_TEMPLATE = "[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1"
# Weights drawn wider than transformers' 0.02: at 0.02 a tiny random model's logits barely depend on the
# input (nor on the segment ids), which would let a wrong graph pass a 1e-4 comparison.
INIT_RANGE = 0.2


def make_pair_classifier(directory: Path, seed: int = 11) -> Path:
    return make_checkpoint(
        directory, "BertForSequenceClassification", num_labels=3, seed=seed, initializer_range=INIT_RANGE
    )


def make_cross_encoder(directory: Path, scratch: Path, seed: int = 12, **options) -> Path:
    """`options`: CrossEncoder's own (activation_fn, max_length...); num_labels 1 unless given."""
    from sentence_transformers import CrossEncoder

    options = {"num_labels": 1, "max_length": CROSS_ENCODER_MAX_LENGTH, **options}
    base = make_checkpoint(
        scratch,
        "BertForSequenceClassification",
        num_labels=options["num_labels"],
        seed=seed,
        initializer_range=INIT_RANGE,
    )
    CrossEncoder(str(base), device="cpu", **options).save(str(directory))
    return Path(directory)


@dataclass
class PairModel:
    """An exported pair model and its references (loaded on first use, then kept)."""

    name: str
    repo: Path
    checkpoint: Path  # the Hugging Face / sentence-transformers directory it was exported from
    is_cross_encoder: bool
    _loaded: dict = field(default_factory=dict, repr=False)

    @property
    def directory(self) -> Path:
        return self.repo / self.name / "1"

    @property
    def manifest(self) -> Manifest:
        return read_manifest(self.directory)

    @property
    def max_length(self) -> int:
        return self.manifest.max_length

    def transformers_model(self):
        """transformers' BertForSequenceClassification of the checkpoint (eager attention, eval)."""
        if "model" not in self._loaded:
            import transformers

            self._loaded["model"] = transformers.AutoModelForSequenceClassification.from_pretrained(
                self.checkpoint, attn_implementation="eager"
            ).eval()
        return self._loaded["model"]

    def hf_tokenizer(self):
        if "tokenizer" not in self._loaded:
            import transformers

            self._loaded["tokenizer"] = transformers.AutoTokenizer.from_pretrained(self.checkpoint)
        return self._loaded["tokenizer"]

    def cross_encoder(self):
        """sentence-transformers' CrossEncoder loaded from the checkpoint (only for the cross-encoder)."""
        if not self.is_cross_encoder:
            raise ValueError(f"{self.name} is not a CrossEncoder")
        if "cross_encoder" not in self._loaded:
            from sentence_transformers import CrossEncoder

            self._loaded["cross_encoder"] = CrossEncoder(str(self.checkpoint), device="cpu")
        return self._loaded["cross_encoder"]

    def encode_pairs(
        self, firsts: Sequence[str], seconds: Sequence[str], truncation: str | bool = "longest_first"
    ) -> dict[str, np.ndarray]:
        """transformers' tokenization of the pairs at the manifest's max_length, padded (int64 arrays)."""
        batch = self.hf_tokenizer()(
            list(firsts),
            list(seconds),
            truncation=truncation,
            max_length=self.max_length,
            padding=True,
            return_tensors="np",
        )
        return {k: batch[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}

    def expected_logits(
        self, firsts: Sequence[str], seconds: Sequence[str], truncation: str | bool = "longest_first"
    ) -> np.ndarray:
        """(N, labels) logits of transformers' model on the pairs."""
        return self.logits_of(self.encode_pairs(firsts, seconds, truncation))

    def logits_of(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        """transformers' logits for token arrays (input_ids, attention_mask, token_type_ids)."""
        import torch

        with torch.no_grad():
            out = self.transformers_model()(**{k: torch.from_numpy(v) for k, v in feed.items()})
        return out.logits.numpy()

    def expected_scores(self, pairs: Sequence[tuple[str, str]], **predict_options) -> np.ndarray:
        """`CrossEncoder.predict` on the pairs: (N,) scores, its activation applied (sigmoid here)."""
        return np.asarray(self.cross_encoder().predict(list(pairs), **predict_options), dtype=np.float32)


def export_pair_repo(repo: Path, scratch: Path) -> dict[str, PairModel]:
    """Exports the three models into `repo` through the CLI (version 1 each, fp32 graphs)."""

    classifier = make_pair_classifier(scratch / "pair-classifier")
    cross_encoder = make_cross_encoder(scratch / "cross-encoder", scratch / "cross-encoder-base")
    embed = make_checkpoint(scratch / "pair-embed", "BertModel", seed=13, initializer_range=INIT_RANGE)
    exports = [
        (PAIR_CLASSIFIER, classifier, ["--pairs"]),
        (CROSS_ENCODER, cross_encoder, []),
        (PAIR_EMBED, embed, []),
    ]
    export_all(repo, exports)
    return {
        PAIR_CLASSIFIER: PairModel(PAIR_CLASSIFIER, repo, classifier, is_cross_encoder=False),
        CROSS_ENCODER: PairModel(CROSS_ENCODER, repo, cross_encoder, is_cross_encoder=True),
    }
