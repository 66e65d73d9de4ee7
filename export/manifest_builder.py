"""Builds the repository's manifest (schema: bertserve/repository.py) from what the export measured."""

from __future__ import annotations

import contextlib
import importlib.metadata
from datetime import datetime, timezone
from pathlib import Path

from tokenizers import Tokenizer

from bertserve import __version__
from bertserve.export.checkpoint import MASKED_LM, SEQUENCE_CLASSIFICATION, Checkpoint
from bertserve.export.embedding_defaults import EmbeddingDefaults
from bertserve.export.embedding_options import EmbeddingOptions
from bertserve.export.onnx_export import GraphIO
from bertserve.export.optimize import opset_of
from bertserve.export.tokenizer_files import SpecialTokens, pair_template
from bertserve.repository import (
    ClassifyTask,
    CrossEncoderSpec,
    EmbedTask,
    EncoderRef,
    ExportInfo,
    FillMaskTask,
    GraphSpec,
    Manifest,
    ModelDimensions,
    Parity,
    PretrainingInfo,
    Tasks,
    TensorSpec,
    TokenizerSpec,
    sha256_file,
)

PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")


def graph_spec(
    path: Path,
    io: GraphIO,
    parity: Parity,
    precision: str = "fp32",
    optimized: bool = False,
    fusions: dict[str, int] | None = None,
) -> GraphSpec:
    return GraphSpec(
        file=path.name,
        sha256=sha256_file(path),
        size_bytes=path.stat().st_size,
        inputs=[TensorSpec(name=n, dtype=io.input_dtypes[n], shape=s) for n, s in io.inputs.items()],
        outputs=[TensorSpec(name=n, dtype="float32", shape=s) for n, s in io.outputs.items()],
        opset=opset_of(path),
        precision=precision,
        optimized=optimized,
        fusions=fusions or {},
        parity=parity,
    )


def tasks_for(
    checkpoint: Checkpoint,
    defaults: EmbeddingDefaults,
    specials: SpecialTokens,
    classifier_input: str = "pooler_output",
    pairs: bool = False,
    cross_encoder: CrossEncoderSpec | None = None,
    options: EmbeddingOptions | None = None,
    calibration: tuple[dict[str, list[list[float]]], int] = ({}, 0),
) -> Tasks:
    """`pairs`: a classifier trained on sentence pairs (--pairs); a recognised cross-encoder is one too.
    `options`: the Matryoshka dimensions and prompts; `calibration`: (int8/uint8 ranges, texts they came from)."""
    config = checkpoint.config
    options = options or EmbeddingOptions()
    embed = EmbedTask(
        pooling=defaults.pooling,
        normalize=defaults.normalize,
        dimension=config.hidden_size,
        dimensions=list(options.dimensions),
        prompts=dict(options.prompts),
        default_prompt_name=options.default_prompt_name,
        calibration_ranges=calibration[0],
        calibration_texts=calibration[1],
    )
    fill_mask = classify = None
    if checkpoint.architecture == MASKED_LM:
        fill_mask = FillMaskTask(mask_token=specials.mask_token, mask_token_id=specials.mask_token_id)
    if checkpoint.architecture == SEQUENCE_CLASSIFICATION:
        problem = config.problem_type
        if problem not in PROBLEM_TYPES:
            problem = "regression" if config.num_labels == 1 else "single_label_classification"
        classify = ClassifyTask(
            id2label=config.id2label,
            problem_type=problem,
            encoder_output=classifier_input,
            pairs=pairs or cross_encoder is not None,
            cross_encoder=cross_encoder,
        )
    return Tasks(embed=embed, fill_mask=fill_mask, classify=classify)


def options_of(embed: EmbedTask) -> EmbeddingOptions:
    """The options an exported model's embed task records (a head-only model takes its encoder's)."""
    return EmbeddingOptions(tuple(embed.dimensions), dict(embed.prompts), embed.default_prompt_name)


def _versions() -> dict[str, str]:
    versions = {}
    for package in ("torch", "onnx", "onnxruntime", "onnxruntime-gpu", "transformers", "tokenizers"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return versions


def tokenizer_spec(specials: SpecialTokens, tokenizer_path: Path) -> TokenizerSpec:
    return TokenizerSpec(
        file=tokenizer_path.name,
        sha256=sha256_file(tokenizer_path),
        do_lower_case=specials.do_lower_case,
        cls_token=specials.cls_token,
        sep_token=specials.sep_token,
        pad_token=specials.pad_token,
        pad_token_id=specials.pad_token_id,
        mask_token=specials.mask_token,
        mask_token_id=specials.mask_token_id if specials.mask_token_id is not None else -1,
        pair_template=pair_template(Tokenizer.from_file(str(tokenizer_path))),
    )


def dimensions_of(checkpoint: Checkpoint) -> ModelDimensions:
    c = checkpoint.config
    return ModelDimensions(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size,
        max_position_embeddings=c.max_position_embeddings,
        type_vocab_size=c.type_vocab_size,
    )


def build_manifest(
    *,
    name: str,
    version: int,
    checkpoint: Checkpoint,
    source: str,
    max_length: int,
    tokenizer: TokenizerSpec,
    tasks: Tasks,
    graphs: dict[str, GraphSpec],
    seconds: dict[str, float],
    encoder: EncoderRef | None = None,
    pretraining: PretrainingInfo | None = None,
) -> Manifest:
    return Manifest(
        name=name,
        version=version,
        max_length=max_length,
        dimensions=dimensions_of(checkpoint),
        tokenizer=tokenizer,
        tasks=tasks,
        graphs=graphs,
        encoder=encoder,
        export=ExportInfo(
            tool_version=__version__,
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            source=source,
            source_architecture=checkpoint.architecture,
            versions=_versions(),
            seconds={k: round(v, 3) for k, v in seconds.items()},
            pretraining=pretraining,
        ),
    )
