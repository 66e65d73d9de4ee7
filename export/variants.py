"""The graphs an export can write, described once: for each, the gate (does this export build it), how to
build it, how to verify it against PyTorch, and what the manifest records. `export/pipeline.py` runs them
in this order with one loop; a later variant may use an earlier one's file (int8 and fp16 are made from the
fused fp32 encoder).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from torch import nn

from bertserve.export import onnx_export, optimize, tied_decoder, verify
from bertserve.export.checkpoint import MASKED_LM, SEQUENCE_CLASSIFICATION, Checkpoint
from bertserve.export.embedding_defaults import EmbeddingDefaults
from bertserve.export.errors import ExportError
from bertserve.export.sentences import SENTENCES
from bertserve.export.shared_encoder import SharedEncoder
from bertserve.export.tokenizer_files import SpecialTokens, encode
from bertserve.repository import (
    CLASSIFIER_HEAD,
    CLS_HIDDEN_STATE,
    DECODER_WEIGHT,
    ENCODER,
    ENCODER_ATTENTIONS,
    ENCODER_FP16,
    ENCODER_INT8,
    MLM_HEAD,
    POOLER_OUTPUT,
    Parity,
    TiedDecoder,
    graph_file,
)

# Reduced-precision gates: mean cosine of sentence embeddings to the fp32 graph, and an absolute bound on
# |graph - PyTorch| relative to the embeddings' scale. Read when a graph is verified (tests lower them).
MIN_COSINE = {ENCODER_INT8: 0.99, ENCODER_FP16: 0.999}
RELATIVE_BOUND = {ENCODER_INT8: 0.25, ENCODER_FP16: 0.02}


@dataclass(frozen=True)
class ExportOptions:
    int8: bool = False
    fp16: bool = False
    attentions: bool = False
    tolerance: float = 1e-4


@dataclass
class ExportContext:
    """What every variant may use; the expensive parts are computed on first use."""

    checkpoint: Checkpoint
    defaults: EmbeddingDefaults
    tokenizer: Tokenizer
    specials: SpecialTokens
    options: ExportOptions
    work_dir: Path  # scratch files (the unfused trace, the fused graph before the CPU rewrite)
    stage_dir: Path  # the version being written
    shared: SharedEncoder | None = None  # set: a head-only export onto this encoder model
    fusions: dict[str, int] = field(default_factory=dict)  # the fp32 encoder's, set when it is fused
    ort_fusions: dict[str, int] = field(default_factory=dict)  # the same before the CPU rewrite
    tied_decoder: TiedDecoder | None = None  # set when a tied mlm_head is built (export/tied_decoder.py)

    @property
    def owns_encoder(self) -> bool:
        return self.shared is None

    @property
    def fp32_path(self) -> Path:
        return self.stage_dir / graph_file(ENCODER)

    @property
    def fused_fp32_path(self) -> Path:
        """ORT's fused fp32 graph before the CPU rewrite (export/optimize.py), the float16 graph's source."""
        return self.work_dir / "encoder_fused.onnx"

    @cached_property
    def encoder_module(self) -> nn.Module:
        return onnx_export.EncoderGraph(self.checkpoint.encoder, self.defaults.pooling).eval()

    @cached_property
    def encoder_cases(self) -> list[verify.ParityCase]:
        c = self.checkpoint.config
        return verify.encoder_cases(
            self.encoder_module, self.defaults.max_length, c.vocab_size, c.type_vocab_size
        )

    @cached_property
    def sentence_feed(self) -> dict[str, np.ndarray]:
        return encode(self.tokenizer, list(SENTENCES), self.specials.pad_token_id)

    @cached_property
    def attentions_module(self) -> nn.Module:
        return onnx_export.EncoderAttentionsGraph(self.checkpoint.encoder).eval()

    @cached_property
    def tied(self) -> tuple[np.ndarray, dict[str, str]] | None:
        """(decoder table, encoder initializers holding it) for an MLM head tied to its encoder's table."""
        return tied_decoder.plan(self.checkpoint, tied_decoder.encoder_graphs(self.shared, self.stage_dir))

    @cached_property
    def head_module(self) -> nn.Module:
        model = self.checkpoint.model
        if self.checkpoint.architecture == MASKED_LM:
            return onnx_export.TiedMlmHeadGraph(model) if self.tied else onnx_export.MlmHeadGraph(model)
        if self.owns_encoder:
            return onnx_export.ClassifierHeadGraph(model)
        if not self.checkpoint.has_pooler:
            raise ExportError(
                f"{self.checkpoint.directory}: a classifier without a pooler cannot share an encoder"
            )
        return onnx_export.PoolerClassifierHeadGraph(model)

    @property
    def classifier_input(self) -> str:
        return POOLER_OUTPUT if self.owns_encoder else CLS_HIDDEN_STATE


@dataclass(frozen=True)
class Variant:
    key: str
    wanted: Callable[[ExportContext], bool]  # the gate: whether this export builds the graph
    io: Callable[[ExportContext], onnx_export.GraphIO]
    build_title: str
    build: Callable[[ExportContext, Path, onnx_export.GraphIO], None]
    verify_title: str
    verify: Callable[[ExportContext, Path, onnx_export.GraphIO], Parity]
    precision: str = "fp32"
    fused: bool = False  # records the fp32 encoder's fusions
    from_fused: bool = False  # made from ORT's fused graph, not the CPU rewrite (records its fusions)


def _parity(worst: float, cases: list[verify.ParityCase], tolerance: float) -> Parity:
    return Parity(max_abs_diff=worst, tolerance=tolerance, shapes_checked=[c.shape for c in cases])


def _encoder_io(ctx: ExportContext) -> onnx_export.GraphIO:
    return onnx_export.encoder_io(ctx.checkpoint.config.hidden_size, ctx.checkpoint.has_pooler)


def _build_fp32(ctx: ExportContext, path: Path, io: onnx_export.GraphIO) -> None:
    """Trace, verify the traced graph (a tracing fault is reported as such), then fuse with ORT."""
    raw = ctx.work_dir / "encoder_traced.onnx"
    onnx_export.trace_to_onnx(ctx.encoder_module, io, raw)
    verify.check_parity(raw, ctx.encoder_cases, ctx.options.tolerance)
    c = ctx.checkpoint.config
    ctx.ort_fusions, ctx.fusions = optimize.optimize_encoder(
        raw, ctx.fused_fp32_path, path, c.num_attention_heads, c.hidden_size
    )


def _verify_fp32(ctx: ExportContext, path: Path, io: onnx_export.GraphIO) -> Parity:
    worst = verify.check_parity(path, ctx.encoder_cases, ctx.options.tolerance)
    return _parity(worst, ctx.encoder_cases, ctx.options.tolerance)


def _verify_reduced(ctx: ExportContext, path: Path, io: onnx_export.GraphIO) -> Parity:
    key = path.stem
    report = verify.compare_reduced_precision(path, ctx.fp32_path, ctx.encoder_module, ctx.sentence_feed)
    verify.check_gate(path, report, MIN_COSINE[key])
    bound = RELATIVE_BOUND[key] * report.scale
    if not report.max_abs_diff <= bound:
        raise ExportError(
            f"{path.name}: embeddings differ from PyTorch by {report.max_abs_diff:.3g} (> {bound:.3g})"
        )
    shape = list(ctx.sentence_feed["input_ids"].shape)
    return Parity(
        max_abs_diff=report.max_abs_diff,
        tolerance=bound,
        shapes_checked=[shape],
        cosine_to_fp32=report.mean_cosine,
    )


def _attentions_io(ctx: ExportContext) -> onnx_export.GraphIO:
    c = ctx.checkpoint.config
    return onnx_export.attentions_io(c.hidden_size, c.num_hidden_layers, c.num_attention_heads)


def _verify_attentions(ctx: ExportContext, path: Path, io: onnx_export.GraphIO) -> Parity:
    c = ctx.checkpoint.config
    cases = verify.encoder_cases(
        ctx.attentions_module, ctx.defaults.max_length, c.vocab_size, c.type_vocab_size
    )
    return _parity(verify.check_parity(path, cases, ctx.options.tolerance), cases, ctx.options.tolerance)


def _mlm_io(ctx: ExportContext) -> onnx_export.GraphIO:
    c = ctx.checkpoint.config
    if ctx.tied:
        return onnx_export.tied_mlm_head_io(c.hidden_size, c.vocab_size)
    return onnx_export.mlm_head_io(c.hidden_size, c.vocab_size)


def _build_mlm(ctx: ExportContext, path: Path, io: onnx_export.GraphIO) -> None:
    onnx_export.trace_to_onnx(ctx.head_module, io, path)
    if ctx.tied:
        tied_decoder.gemm_on_the_table(path)
        table, initializers = ctx.tied
        ctx.tied_decoder = tied_decoder.write_table(table, ctx.stage_dir, initializers)


def _classifier_io(ctx: ExportContext) -> onnx_export.GraphIO:
    c = ctx.checkpoint.config
    return onnx_export.classifier_head_io(c.hidden_size, c.num_labels, ctx.classifier_input)


def _trace_head(ctx: ExportContext, path: Path, io: onnx_export.GraphIO) -> None:
    onnx_export.trace_to_onnx(ctx.head_module, io, path)


def _verify_head(ctx: ExportContext, path: Path, io: onnx_export.GraphIO) -> Parity:
    fixed = {DECODER_WEIGHT: ctx.tied[0]} if DECODER_WEIGHT in io.inputs else None  # the table, fed
    cases = verify.head_cases(ctx.head_module, io, fixed=fixed)
    return _parity(verify.check_parity(path, cases, ctx.options.tolerance), cases, ctx.options.tolerance)


VARIANTS: tuple[Variant, ...] = (
    Variant(
        key=ENCODER,
        wanted=lambda ctx: ctx.owns_encoder,
        io=_encoder_io,
        build_title="tracing the encoder (TorchScript tracer), checking the trace, fusing with ORT's optimizer",
        build=_build_fp32,
        verify_title="verifying the fused graph against PyTorch over the shape grid",
        verify=_verify_fp32,
        fused=True,
    ),
    Variant(
        key=ENCODER_INT8,
        wanted=lambda ctx: ctx.owns_encoder and ctx.options.int8,
        io=_encoder_io,
        build_title="quantizing to int8 (dynamic, per channel)",
        build=lambda ctx, path, io: optimize.quantize_int8(ctx.fp32_path, path),
        verify_title=f"checking against fp32 on {len(SENTENCES)} sentences",
        verify=_verify_reduced,
        precision="int8",
        fused=True,
    ),
    Variant(
        key=ENCODER_FP16,
        wanted=lambda ctx: ctx.owns_encoder and ctx.options.fp16,
        io=_encoder_io,
        build_title="converting to float16 (float32 inputs/outputs)",
        build=lambda ctx, path, io: optimize.convert_fp16(ctx.fused_fp32_path, path),
        verify_title=f"checking against fp32 on {len(SENTENCES)} sentences",
        verify=_verify_reduced,
        precision="fp16",
        fused=True,
        from_fused=True,
    ),
    Variant(
        key=ENCODER_ATTENTIONS,
        wanted=lambda ctx: ctx.owns_encoder and ctx.options.attentions,
        io=_attentions_io,
        build_title="tracing the attention-map graph (unfused)",
        build=lambda ctx, path, io: onnx_export.trace_to_onnx(ctx.attentions_module, io, path),
        verify_title="verifying it against PyTorch over the shape grid",
        verify=_verify_attentions,
    ),
    Variant(
        key=MLM_HEAD,
        wanted=lambda ctx: ctx.checkpoint.architecture == MASKED_LM,
        io=_mlm_io,
        build_title="tracing the MLM head (its decoder an input when tied to the encoder's table)",
        build=_build_mlm,
        verify_title="verifying it against PyTorch",
        verify=_verify_head,
    ),
    Variant(
        key=CLASSIFIER_HEAD,
        wanted=lambda ctx: ctx.checkpoint.architecture == SEQUENCE_CLASSIFICATION,
        io=_classifier_io,
        build_title="tracing the classifier head",
        build=_trace_head,
        verify_title="verifying it against PyTorch",
        verify=_verify_head,
    ),
)
