"""int8/uint8 calibration ranges of an embedding model, computed once at export.

The fixed corpus calibration_texts.txt (one English sentence a line, shipped with the package) is embedded by
the exported fp32 encoder graph (ONNX Runtime, batches of BATCH texts of similar lengths, no prompt); for each
size d of {hidden size} + the Matryoshka dimensions the pooled vectors are cut to their first d values
("<d>:raw") and then L2-normalized ("<d>:normalized"), and the range of each is its per-dimension [min, max]:
the `ranges` sentence-transformers' quantize_embeddings computes from `calibration_embeddings`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from bertserve.export import verify
from bertserve.export.tokenizer_files import encode
from bertserve.repository import SENTENCE_EMBEDDING

CORPUS = Path(__file__).with_name("calibration_texts.txt")
BATCH = 32


def calibration_texts() -> list[str]:
    return [line for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


def embed_texts(encoder: Path, tokenizer: Tokenizer, pad_id: int, texts: list[str]) -> np.ndarray:
    """(len(texts), hidden) float32 pooled vectors (not normalized) of the encoder graph, in texts' order.
    Batches hold texts of similar token counts (a stable sort), so that little is padding."""
    session = verify.session(encoder)
    names = {i.name for i in session.get_inputs()}
    order = np.argsort([len(e.ids) for e in tokenizer.encode_batch(texts)], kind="stable")
    pieces = []
    for start in range(0, len(texts), BATCH):
        feed = encode(tokenizer, [texts[i] for i in order[start : start + BATCH]], pad_id)
        pieces.append(session.run([SENTENCE_EMBEDDING], {k: v for k, v in feed.items() if k in names})[0])
    vectors = np.empty((len(texts), pieces[0].shape[1]), dtype=np.float32)
    vectors[order] = np.concatenate(pieces)
    return vectors


def cut(vectors: np.ndarray, d: int, normalized: bool) -> np.ndarray:
    """The first d values of each vector, then L2-normalized when `normalized`."""
    out = vectors[:, :d]
    if normalized:
        out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), np.float32(1e-12))
    return out.astype(np.float32, copy=False)


def ranges_of(vectors: np.ndarray, sizes: Iterable[int]) -> dict[str, list[list[float]]]:
    """{"<d>:normalized" | "<d>:raw": [per-dimension minimums, maximums]} for each size d."""
    ranges = {}
    for d in sorted(set(sizes)):
        for normalized in (True, False):
            part = cut(vectors, d, normalized)
            key = f"{d}:{'normalized' if normalized else 'raw'}"
            ranges[key] = np.vstack((part.min(axis=0), part.max(axis=0))).tolist()
    return ranges


def calibration_ranges(
    encoder: Path, tokenizer: Tokenizer, pad_id: int, sizes: Iterable[int]
) -> tuple[dict[str, list[list[float]]], int]:
    """(ranges_of the corpus's vectors, how many texts) for an exported fp32 encoder graph."""
    texts = calibration_texts()
    return ranges_of(embed_texts(encoder, tokenizer, pad_id, texts), sizes), len(texts)
