"""Dense vectors in other encodings, with the arithmetic of sentence-transformers' `quantize_embeddings`
(float16: a plain cast): the answers equal that function's on the same float32 vectors and ranges."""

from __future__ import annotations

import numpy as np


def quantize(vectors: np.ndarray, encoding: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """vectors (n, D) float32 -> float16 (n, D); int8 / uint8 (n, D) from `ranges` (2, D) = per-dimension
    [min, max] cut into 256 steps; binary int8 / ubinary uint8 (n, ceil(D / 8)): the bits of x > 0, packed
    big-endian (binary is ubinary - 128)."""
    if encoding == "float":
        return vectors
    if encoding == "float16":
        return vectors.astype(np.float16)
    if encoding in ("int8", "uint8"):
        if ranges is None:
            raise ValueError(f"{encoding} needs calibration ranges")
        ranges = ranges.astype(np.float32, copy=False)
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        buckets = np.clip(np.floor((vectors - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if encoding == "uint8" else (buckets - 128).astype(np.int8)
    packed = np.packbits(vectors > 0, axis=-1)  # (n, ceil(D / 8)) uint8
    if encoding == "ubinary":
        return packed
    if encoding == "binary":
        return (packed.astype(np.int16) - 128).astype(np.int8)
    raise ValueError(f"unknown encoding {encoding!r}")
