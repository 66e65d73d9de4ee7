"""`export_model`: Hugging Face checkpoint -> verified ONNX model repository version.

Stages: load checkpoint -> trace graphs -> verify (ONNX Runtime vs PyTorch, shape grid) -> optimize
(ORT fusions) -> verify again -> optional int8 / fp16 / attentions variants, each gated -> write
tokenizer and manifest -> rename the staged directory into REPO/NAME/VERSION. Any failure raises
ExportError with a one-line message and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bertserve.export import onnx_export, optimize, verify
from bertserve.export.checkpoint import MASKED_LM, SEQUENCE_CLASSIFICATION, Checkpoint, load_checkpoint
from bertserve.export.embedding_defaults import read_embedding_defaults
from bertserve.export.errors import ExportError
from bertserve.export.manifest_builder import build_manifest, graph_spec
from bertserve.export.repository import check_name, choose_version, staged_version
from bertserve.export.sentences import SENTENCES
from bertserve.export.tokenizer_files import (
    TOKENIZER_FILE,
    encode,
    for_repository,
    load_tokenizer,
    special_tokens,
)
from bertserve.manifest import (
    CLASSIFIER_HEAD,
    ENCODER,
    ENCODER_ATTENTIONS,
    ENCODER_FP16,
    ENCODER_INT8,
    MLM_HEAD,
    GraphSpec,
    Parity,
)

__all__ = ["ExportError", "export_model"]

INT8_MIN_COSINE = 0.99  # mean cosine of sentence embeddings to the fp32 graph
FP16_MIN_COSINE = 0.999
# Reduced-precision graphs are also held to an absolute bound relative to the embeddings' scale.
INT8_RELATIVE_BOUND = 0.25
FP16_RELATIVE_BOUND = 0.02


class StageLog:
    """Prints each stage as it starts and ends, and keeps the seconds for the manifest."""

    def __init__(self, log: Callable[[str], None]):
        self.log, self.seconds = log, {}

    @contextlib.contextmanager
    def stage(self, key: str, title: str) -> Iterator[list[str]]:
        self.log(f"-> {title} ...")
        notes: list[str] = []
        start = time.perf_counter()
        yield notes  # the stage may append a result line
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start
        self.log(f"   {'; '.join(notes) or 'done'} ({time.perf_counter() - start:.1f} s)")


def default_name(directory: Path) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", directory.resolve().name).strip("-._").lower()
    return slug[:64] or "model"


def _parity(worst: float, tolerance: float, cases: list[verify.ParityCase]) -> Parity:
    return Parity(max_abs_diff=worst, tolerance=tolerance, shapes_checked=[c.shape for c in cases])


def _reduced_precision(
    stages: StageLog,
    key: str,
    path: Path,
    fp32: Path,
    checkpoint_graph,
    feed,
    min_cosine: float,
    relative: float,
) -> Parity:
    with stages.stage(
        f"verify_{key}", f"checking {path.name} against fp32 on {len(SENTENCES)} sentences"
    ) as notes:
        report = verify.compare_reduced_precision(path, fp32, checkpoint_graph, feed)
        verify.check_gate(path, report, min_cosine)
        bound = relative * report.scale
        if not report.max_abs_diff <= bound:
            raise ExportError(
                f"{path.name}: embeddings differ from PyTorch by {report.max_abs_diff:.3g} (> {bound:.3g})"
            )
        notes.append(
            f"mean cosine {report.mean_cosine:.5f} (gate {min_cosine}), max |diff| {report.max_abs_diff:.3g}"
        )
    shape = [int(feed["input_ids"].shape[0]), int(feed["input_ids"].shape[1])]
    return Parity(
        max_abs_diff=report.max_abs_diff,
        tolerance=bound,
        shapes_checked=[shape],
        cosine_to_fp32=report.mean_cosine,
    )


def _export_heads(
    checkpoint: Checkpoint, stages: StageLog, stage_dir: Path, tolerance: float
) -> dict[str, GraphSpec]:
    c, graphs = checkpoint.config, {}
    if checkpoint.architecture == MASKED_LM:
        module, io, key = (
            onnx_export.MlmHeadGraph(checkpoint.model),
            onnx_export.mlm_head_io(c.hidden_size, c.vocab_size),
            MLM_HEAD,
        )
    elif checkpoint.architecture == SEQUENCE_CLASSIFICATION:
        module = onnx_export.ClassifierHeadGraph(checkpoint.model)
        io, key = onnx_export.classifier_head_io(c.hidden_size, c.num_labels), CLASSIFIER_HEAD
    else:
        return graphs
    path = stage_dir / f"{key}.onnx"
    with stages.stage(f"export_{key}", f"tracing and verifying {key}") as notes:
        onnx_export.trace_to_onnx(module, io, path)
        cases = verify.head_cases(module, io)
        worst = verify.check_parity(path, cases, tolerance)
        notes.append(f"max |ORT - torch| {worst:.2e}")
    graphs[key] = graph_spec(path, io, _parity(worst, tolerance, cases))
    return graphs


def export_model(
    checkpoint_dir: Path | str,
    out_repo: Path | str,
    name: str | None = None,
    version: int | None = None,
    int8: bool = False,
    fp16: bool = False,
    attentions: bool = False,
    tolerance: float = 1e-4,
    log: Callable[[str], None] = print,
    source: str | None = None,
) -> Path:
    """Exports, verifies and writes REPO/NAME/VERSION; returns that directory. Raises ExportError."""
    checkpoint_dir, out_repo = Path(checkpoint_dir), Path(out_repo)
    stages = StageLog(log)
    with stages.stage("load", f"loading checkpoint {checkpoint_dir}") as notes:
        checkpoint = load_checkpoint(checkpoint_dir)
        c = checkpoint.config
        notes.append(
            f"{checkpoint.architecture}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
            f"{c.num_attention_heads} heads, vocab {c.vocab_size}"
        )
        defaults = read_embedding_defaults(checkpoint_dir, c.max_position_embeddings)
        tokenizer = for_repository(load_tokenizer(checkpoint_dir), defaults.max_length)
        specials = special_tokens(checkpoint_dir, tokenizer)
        if checkpoint.architecture == MASKED_LM and specials.mask_token_id is None:
            raise ExportError(
                f"{checkpoint_dir}: a masked-LM checkpoint whose tokenizer has no {specials.mask_token!r}"
            )
    name = check_name(name or default_name(checkpoint_dir))
    version = choose_version(out_repo, name, version)
    hidden, heads = c.hidden_size, c.num_attention_heads

    with (
        tempfile.TemporaryDirectory(prefix="bertserve-export-") as work,
        staged_version(out_repo, name, version) as stage_dir,
    ):
        raw = Path(work) / "encoder_traced.onnx"
        encoder_graph = onnx_export.EncoderGraph(checkpoint.encoder, defaults.pooling).eval()
        io = onnx_export.encoder_io(hidden, checkpoint.has_pooler)
        with stages.stage("trace", "tracing the encoder to ONNX (TorchScript tracer)"):
            onnx_export.trace_to_onnx(encoder_graph, io, raw)
        with stages.stage("verify_traced", "verifying the traced graph against PyTorch") as notes:
            cases = verify.encoder_cases(encoder_graph, defaults.max_length, c.vocab_size, c.type_vocab_size)
            worst = verify.check_parity(raw, cases, tolerance)
            notes.append(f"max |ORT - torch| {worst:.2e} over {len(cases)} shapes")
        fp32 = stage_dir / f"{ENCODER}.onnx"
        with stages.stage("optimize", "fusing with ONNX Runtime's transformer optimizer") as notes:
            fusions = optimize.optimize_encoder(raw, fp32, heads, hidden)
            notes.append(", ".join(f"{k} x{v}" for k, v in fusions.items()) or "no fusions")
        with stages.stage("verify_optimized", "verifying the optimized graph against PyTorch") as notes:
            worst = verify.check_parity(fp32, cases, tolerance)
            notes.append(f"max |ORT - torch| {worst:.2e}")
        graphs = {
            ENCODER: graph_spec(fp32, io, _parity(worst, tolerance, cases), optimized=True, fusions=fusions)
        }

        feed = encode(tokenizer, list(SENTENCES), specials.pad_token_id) if (int8 or fp16) else None
        if int8:
            path = stage_dir / f"{ENCODER_INT8}.onnx"
            with stages.stage("int8", "quantizing to int8 (dynamic, per channel)"):
                optimize.quantize_int8(fp32, path)
            parity = _reduced_precision(
                stages, "int8", path, fp32, encoder_graph, feed, INT8_MIN_COSINE, INT8_RELATIVE_BOUND
            )
            graphs[ENCODER_INT8] = graph_spec(path, io, parity, "int8", True, fusions)
        if fp16:
            path = stage_dir / f"{ENCODER_FP16}.onnx"
            with stages.stage("fp16", "converting to float16 (float32 inputs/outputs)"):
                optimize.convert_fp16(fp32, path)
            parity = _reduced_precision(
                stages, "fp16", path, fp32, encoder_graph, feed, FP16_MIN_COSINE, FP16_RELATIVE_BOUND
            )
            graphs[ENCODER_FP16] = graph_spec(path, io, parity, "fp16", True, fusions)
        if attentions:
            path = stage_dir / f"{ENCODER_ATTENTIONS}.onnx"
            graph = onnx_export.EncoderAttentionsGraph(checkpoint.encoder).eval()
            att_io = onnx_export.attentions_io(hidden, c.num_hidden_layers, heads)
            with stages.stage(
                "attentions", "tracing and verifying the attention-map graph (unfused)"
            ) as notes:
                onnx_export.trace_to_onnx(graph, att_io, path)
                att_cases = verify.encoder_cases(graph, defaults.max_length, c.vocab_size, c.type_vocab_size)
                att_worst = verify.check_parity(path, att_cases, tolerance)
                notes.append(f"max |ORT - torch| {att_worst:.2e}")
            graphs[ENCODER_ATTENTIONS] = graph_spec(path, att_io, _parity(att_worst, tolerance, att_cases))
        graphs.update(_export_heads(checkpoint, stages, stage_dir, tolerance))

        with stages.stage("write", "writing tokenizer and manifest"):
            tokenizer_path = stage_dir / TOKENIZER_FILE
            tokenizer.save(str(tokenizer_path))
            manifest = build_manifest(
                name=name,
                version=version,
                checkpoint=checkpoint,
                source=source or checkpoint_dir.resolve().name,
                defaults=defaults,
                specials=specials,
                tokenizer_path=tokenizer_path,
                graphs=graphs,
                seconds=stages.seconds,
            )
            manifest.write(stage_dir)
    final = out_repo / name / str(version)
    log(f"wrote {final} ({', '.join(graphs)}) in {sum(stages.seconds.values()):.1f} s")
    return final
