"""ONNX Runtime vs the PyTorch module, before anything is written.

fp32 graphs: the largest absolute difference over a grid of batch x sequence shapes (rows padded to
random lengths) must stay within the tolerance. int8/fp16 graphs: mean cosine of the sentence embeddings
to the fp32 graph, on a built-in sentence set, must reach a gate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from bertserve.export.errors import VerificationError
from bertserve.export.onnx_export import GraphIO

BATCHES = (1, 3, 8)
SEQUENCES = (1, 7, 64)
HEAD_ROWS = (1, 3, 8)


def shape_grid(max_length: int) -> list[tuple[int, int]]:
    lengths = sorted({min(t, max_length) for t in (*SEQUENCES, max_length)})
    return [(b, t) for b in BATCHES for t in lengths]


def token_batch(
    rng: np.random.Generator, batch: int, seq: int, vocab: int, type_vocab: int
) -> dict[str, np.ndarray]:
    """Random ids; row 0 is full length, the other rows are padded to random lengths in [1, seq]."""
    lengths = np.concatenate([[seq], rng.integers(1, seq + 1, size=batch - 1)])
    attention_mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    input_ids = rng.integers(0, vocab, size=(batch, seq)) * attention_mask
    token_type_ids = rng.integers(0, type_vocab, size=(batch, seq)) * attention_mask
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def float_batch(
    rng: np.random.Generator, io: GraphIO, rows: int, fixed: dict[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Random rows for each input, except the inputs `fixed` gives (e.g. a tied head's decoder weight)."""
    fixed = fixed or {}
    feed = {}
    for name, shape in io.inputs.items():
        size = [rows if isinstance(d, str) else d for d in shape]
        feed[name] = fixed[name] if name in fixed else rng.standard_normal(size).astype(np.float32)
    return feed


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_module(module: nn.Module, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        outputs = module(*(torch.from_numpy(v) for v in feed.values()))
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return [o.numpy() for o in outputs]


@dataclass
class ParityCase:
    """One input batch and the PyTorch module's outputs for it (computed once, reused for every graph)."""

    shape: list[int]
    feed: dict[str, np.ndarray]
    expected: list[np.ndarray] = field(default_factory=list)


def encoder_cases(
    module: nn.Module, max_length: int, vocab: int, type_vocab: int, seed: int = 0
) -> list[ParityCase]:
    rng = np.random.default_rng(seed)
    cases = [ParityCase([b, t], token_batch(rng, b, t, vocab, type_vocab)) for b, t in shape_grid(max_length)]
    for case in cases:
        case.expected = run_module(module, case.feed)
    return cases


def head_cases(
    module: nn.Module, io: GraphIO, seed: int = 0, fixed: dict[str, np.ndarray] | None = None
) -> list[ParityCase]:
    rng = np.random.default_rng(seed)
    cases = [ParityCase([n], float_batch(rng, io, n, fixed)) for n in HEAD_ROWS]
    for case in cases:
        case.expected = run_module(module, case.feed)
    return cases


def _defined(name: str, diff: np.ndarray, feed: dict[str, np.ndarray]) -> np.ndarray:
    """The part of an output the contract defines: hidden states and attention rows of padding
    positions are unspecified (nothing reads them), so they are left out of the comparison."""
    if "attention_mask" not in feed:
        return diff
    real = feed["attention_mask"].astype(bool)  # (B, T)
    if name == "last_hidden_state":
        return diff[real]  # (B, T, C) -> (real tokens, C)
    if name == "attentions":
        return diff.transpose(1, 3, 0, 2, 4)[real]  # (L, B, H, T, T) -> (real queries, L, H, T)
    return diff


def max_abs_diff(path: Path, cases: list[ParityCase], outputs: list[str] | None = None) -> float:
    """Over every output (or the named `outputs`, in the order the module returns them)."""
    sess = session(path)
    names = outputs or [o.name for o in sess.get_outputs()]
    worst = 0.0
    for case in cases:
        got = sess.run(names, case.feed)
        if len(got) != len(case.expected):
            raise VerificationError(
                f"{path.name}: {len(got)} outputs, the PyTorch module has {len(case.expected)}"
            )
        for name, g, e in zip(names, got, case.expected, strict=True):
            if g.shape != e.shape:
                raise VerificationError(
                    f"{path.name}: output shape {g.shape} != PyTorch {e.shape} at {case.shape}"
                )
            diff = _defined(name, np.abs(g.astype(np.float64) - e), case.feed)
            worst = max(worst, float(diff.max()))
    return worst


def check_parity(path: Path, cases: list[ParityCase], tolerance: float) -> float:
    worst = max_abs_diff(path, cases)
    if not worst <= tolerance:  # also catches NaN
        raise VerificationError(
            f"{path.name}: ONNX Runtime differs from PyTorch by {worst:.3g} (> tolerance {tolerance:g}) "
            f"over shapes {[c.shape for c in cases]}"
        )
    return worst


@dataclass(frozen=True)
class ReducedPrecisionReport:
    mean_cosine: float  # sentence embeddings, to the fp32 graph
    min_cosine: float
    max_abs_diff: float  # sentence embeddings, to the PyTorch module
    scale: float  # largest |PyTorch sentence embedding|, for bounds relative to it


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)


def compare_reduced_precision(
    path: Path,
    fp32_path: Path,
    module: nn.Module,
    feed: dict[str, np.ndarray],
    output: str = "sentence_embedding",
) -> ReducedPrecisionReport:
    fp32 = session(fp32_path)
    reduced = session(path).run([output], feed)[0]
    reference = fp32.run([output], feed)[0]
    names = [o.name for o in fp32.get_outputs()]
    torch_out = run_module(module, feed)[names.index(output)]
    cos = _cosines(reduced, reference)
    return ReducedPrecisionReport(
        float(cos.mean()),
        float(cos.min()),
        float(np.abs(reduced - torch_out).max()),
        float(np.abs(torch_out).max()),
    )


def check_gate(path: Path, report: ReducedPrecisionReport, min_mean_cosine: float) -> None:
    if not report.mean_cosine >= min_mean_cosine:
        raise VerificationError(
            f"{path.name}: mean cosine to fp32 {report.mean_cosine:.4f} < gate {min_mean_cosine} "
            f"(min {report.min_cosine:.4f})"
        )
