"""References for the embedding-option tests over HTTP, computed with sentence-transformers and transformers
on the checkpoints the served models were exported from (tests/embedding_models.py): dense vectors
(prompts, Matryoshka dimensions, left truncation), quantized encodings, token-level and SPLADE outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.embedding_models import ST_MODEL, version_dir


class Reference:
    def __init__(self, st_model_dir: Path, mlm_checkpoint: Path, repo: Path):
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

        self.torch = torch
        self.st = SentenceTransformer(str(st_model_dir), device="cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(str(st_model_dir))
        self.model = AutoModel.from_pretrained(str(st_model_dir)).eval()
        self.mlm_tokenizer = AutoTokenizer.from_pretrained(str(mlm_checkpoint))
        self.mlm = AutoModelForMaskedLM.from_pretrained(str(mlm_checkpoint)).eval()
        manifest = json.loads((version_dir(repo, ST_MODEL) / "manifest.json").read_text())
        self.embed_task = manifest["tasks"]["embed"]
        self.max_length = manifest["max_length"]

    def prompt(self, name: str | None) -> str:
        return self.embed_task["prompts"][name or self.embed_task["default_prompt_name"]]

    def dense(self, texts: list[str], prompt_name: str | None = None, dim: int | None = None) -> np.ndarray:
        """sentence-transformers' normalized embeddings (its default prompt unless named)."""
        return self.st.encode(
            texts, prompt_name=prompt_name, truncate_dim=dim, normalize_embeddings=True, convert_to_numpy=True
        )

    def ids(self, text: str, *, side: str = "right", special: bool = True) -> list[int]:
        self.tokenizer.truncation_side = side
        try:
            encoded = self.tokenizer(
                text, truncation=special, max_length=self.max_length, add_special_tokens=special
            )
        finally:
            self.tokenizer.truncation_side = "right"
        return encoded["input_ids"]

    def hidden(self, ids: list[int]) -> np.ndarray:
        """The last hidden state of one input, (tokens, hidden)."""
        with self.torch.no_grad():
            out = self.model(input_ids=self.torch.tensor([ids]), attention_mask=self.torch.ones(1, len(ids)))
        return out.last_hidden_state[0].numpy()

    def pooled(self, ids: list[int], normalize: bool = True, dim: int | None = None) -> np.ndarray:
        vector = self.hidden(ids).mean(axis=0)[:dim]
        return vector / np.linalg.norm(vector) if normalize else vector

    def quantized(self, vectors: np.ndarray, precision: str, normalized: bool = True) -> np.ndarray:
        from sentence_transformers.quantization import quantize_embeddings

        if precision == "float16":
            return vectors.astype(np.float16)
        key = f"{vectors.shape[1]}:{'normalized' if normalized else 'raw'}"
        ranges = (
            np.array(self.embed_task["calibration_ranges"][key]) if precision in ("int8", "uint8") else None
        )
        return quantize_embeddings(vectors, precision, ranges=ranges)

    def sparse(self, text: str) -> np.ndarray:
        """SPLADE: per vocabulary id, max over the input's tokens of log(1 + relu(MLM logits))."""
        encoded = self.mlm_tokenizer(text, return_tensors="pt")
        with self.torch.no_grad():
            logits = self.mlm(**encoded).logits[0]
        return self.torch.log1p(self.torch.relu(logits)).max(dim=0).values.numpy()
