"""`export_model`: Hugging Face checkpoint -> verified ONNX model repository version.

Stages: load the checkpoint (sizes checked before anything is allocated) -> for a head-only export
(`encoder=`), prove the named encoder model computes this checkpoint's encoder -> build and verify each
graph variant the export wants (`export/variants.py`: one loop over one table) -> write tokenizer and
manifest -> rename the staged directory into REPO/NAME/VERSION. Any failure raises ExportError with a
one-line message and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bertserve.export import calibration, pair_check, shared_encoder
from bertserve.export.checkpoint import BASE, MASKED_LM, SEQUENCE_CLASSIFICATION, Checkpoint, load_checkpoint
from bertserve.export.cross_encoder import read_cross_encoder
from bertserve.export.embedding_defaults import EmbeddingDefaults, read_embedding_defaults
from bertserve.export.embedding_options import EmbeddingOptions, check_dimensions, read_embedding_options
from bertserve.export.errors import ExportError
from bertserve.export.manifest_builder import (
    build_manifest,
    dimensions_of,
    graph_spec,
    options_of,
    tasks_for,
    tokenizer_spec,
)
from bertserve.export.pretrain.output import pretraining_info
from bertserve.export.staging import check_name, choose_version, remove_stale_staging, staged_version
from bertserve.export.tokenizer_files import for_repository, load_tokenizer, special_tokens
from bertserve.export.variants import VARIANTS, ExportContext, ExportOptions, Variant
from bertserve.repository import (
    CLASSIFIER_HEAD,
    CLS_HIDDEN_STATE,
    TOKENIZER_FILE,
    CosineFusion,
    CrossEncoderSpec,
    GraphSpec,
    Parity,
    graph_file,
    list_versions,
    read_manifest,
)

__all__ = ["ExportError", "export_model"]


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


def _describe(parity: Parity) -> str:
    if parity.cosine_to_fp32 is not None:
        return f"mean cosine to fp32 {parity.cosine_to_fp32:.5f}, max |diff| {parity.max_abs_diff:.3g}"
    return f"max |ORT - torch| {parity.max_abs_diff:.2e} over {len(parity.shapes_checked)} shapes"


def build_variant(variant: Variant, ctx: ExportContext, stages: StageLog) -> GraphSpec:
    path = ctx.stage_dir / graph_file(variant.key)
    io = variant.io(ctx)
    with stages.stage(f"build_{variant.key}", f"{variant.key}: {variant.build_title}"):
        variant.build(ctx, path, io)
    with stages.stage(f"verify_{variant.key}", f"{variant.key}: {variant.verify_title}") as notes:
        parity = variant.verify(ctx, path, io)
        notes.append(_describe(parity))
    fusions = (ctx.ort_fusions if variant.from_fused else ctx.fusions) if variant.fused else {}
    return graph_spec(path, io, parity, variant.precision, variant.fused, fusions)


def pair_model(
    checkpoint: Checkpoint, defaults: EmbeddingDefaults, pairs: bool
) -> tuple[CrossEncoderSpec | None, EmbeddingDefaults]:
    """(the CrossEncoder spec when the checkpoint is one, the defaults with its max_length); refuses
    --pairs, or a cross-encoder, on a model that cannot be one."""
    directory, c = checkpoint.directory, checkpoint.config
    cross_encoder = read_cross_encoder(directory, c.num_labels, defaults.max_length)
    if pairs and checkpoint.architecture != SEQUENCE_CLASSIFICATION:
        raise ExportError(
            f"--pairs marks a sequence classifier trained on sentence pairs; {directory} is a "
            f"{checkpoint.architecture} checkpoint (no classify head)"
        )
    if cross_encoder is None:
        if pairs and c.type_vocab_size < 2:
            raise ExportError(f"--pairs: {directory} has type_vocab_size {c.type_vocab_size} (pairs need 2)")
        return None, defaults
    if checkpoint.architecture != SEQUENCE_CLASSIFICATION or c.type_vocab_size < 2:
        raise ExportError(
            f"{directory}: a cross-encoder needs a {SEQUENCE_CLASSIFICATION} with type_vocab_size 2 or more "
            f"(this is a {checkpoint.architecture}, type_vocab_size {c.type_vocab_size})"
        )
    # its modules.json describes scoring, not embedding: the embed task keeps bertserve's defaults
    max_length = cross_encoder.max_length or defaults.max_length
    return cross_encoder, EmbeddingDefaults("mean", True, max_length, "cross-encoder config")


def with_fusion(
    cross_encoder: CrossEncoderSpec | None, fusion: CosineFusion, out_repo: Path, directory: Path
) -> CrossEncoderSpec:
    """The cross-encoder's spec with `fusion`, once its embedding model is in the repository."""
    if cross_encoder is None or cross_encoder.activation == "softmax":
        raise ExportError(
            f"{directory}: a cosine fusion needs a cross-encoder of one score (sigmoid or identity)"
        )
    model_dir = out_repo / fusion.embedding_model
    versions = list_versions(model_dir)
    if not versions or read_manifest(model_dir / str(versions[-1])).tasks.embed is None:
        raise ExportError(
            f"fusion: embedding model {fusion.embedding_model!r} is not in {out_repo} (export it first)"
        )
    return cross_encoder.model_copy(update={"fusion": fusion})


def embedding_options(
    checkpoint: Checkpoint,
    defaults: EmbeddingDefaults,
    cross_encoder: CrossEncoderSpec | None,
    dimensions: list[int] | None,
) -> EmbeddingOptions:
    """The Matryoshka dimensions (--dimensions over the config's) and prompts the embed task records; a
    cross-encoder's sentence-transformers config describes scoring, so only --dimensions applies to it."""
    hidden = checkpoint.config.hidden_size
    if cross_encoder is not None:
        return EmbeddingOptions(check_dimensions(dimensions or [], hidden, "--dimensions"))
    return read_embedding_options(checkpoint.directory, hidden, dimensions, defaults.include_prompt)


def describe_options(options: EmbeddingOptions) -> str:
    prompts = ", ".join(options.prompts) or "none"
    if options.default_prompt_name is not None:
        prompts += f" (default {options.default_prompt_name})"
    return f"Matryoshka dimensions {list(options.dimensions) or 'none'}, prompts {prompts}"


def check_pairs(ctx: ExportContext, stages: StageLog) -> None:
    """A classifier's encoder and classifier_head graphs, chained, against its module on sentence pairs
    (not for a model that cannot take a second text: one segment embedding, or too short for two)."""
    c, specials = ctx.checkpoint.config, ctx.specials
    if (
        ctx.checkpoint.architecture != SEQUENCE_CLASSIFICATION
        or c.type_vocab_size < 2
        or ctx.defaults.max_length < 5
    ):
        return
    encoder = ctx.shared.fp32_path if ctx.shared is not None else ctx.fp32_path
    cls_id, sep_id = (ctx.tokenizer.token_to_id(t) for t in (specials.cls_token, specials.sep_token))
    with stages.stage(
        "verify_pairs", "classifier: encoder + head against PyTorch on sentence pairs"
    ) as notes:
        feeds = pair_check.pair_feeds(
            ctx.tokenizer, ctx.defaults.max_length, c.vocab_size, cls_id, sep_id, specials.pad_token_id
        )
        worst = pair_check.check_classifier_pairs(
            encoder,
            ctx.stage_dir / graph_file(CLASSIFIER_HEAD),
            ctx.classifier_input,
            ctx.checkpoint.model,
            feeds,
            ctx.options.tolerance,
        )
        notes.append(f"max |ORT - torch| {worst:.2e} over {len(feeds)} pair batches")


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
    encoder: str | None = None,
    pairs: bool = False,
    dimensions: list[int] | None = None,
    fusion: CosineFusion | None = None,
) -> Path:
    """Exports, verifies and writes REPO/NAME/VERSION; returns that directory. Raises ExportError.

    `encoder` (NAME or NAME:VERSION of an encoder model in `out_repo`): write a head-only model that runs
    on that encoder model, after proving it computes this checkpoint's encoder. `pairs`: the checkpoint is
    a sequence classifier trained on sentence pairs (a sentence-transformers CrossEncoder is recognised).
    `dimensions`: the Matryoshka sizes (each below the hidden size), instead of the checkpoint's own.
    `fusion`: a cross-encoder's score also adds the cosine of an embedding model already in `out_repo`."""
    checkpoint_dir, out_repo = Path(checkpoint_dir), Path(out_repo)
    options = ExportOptions(int8=int8, fp16=fp16, attentions=attentions, tolerance=tolerance)
    if encoder is not None and (int8 or fp16 or attentions):
        raise ExportError(
            "--int8, --fp16 and --attentions make encoder graphs; with --encoder the encoder's are used"
        )
    if encoder is not None and dimensions is not None:
        raise ExportError("--dimensions describes encoder outputs; with --encoder the encoder's are used")
    stages = StageLog(log)
    with stages.stage("load", f"loading checkpoint {checkpoint_dir}") as notes:
        checkpoint = load_checkpoint(checkpoint_dir)
        c = checkpoint.config
        notes.append(
            f"{checkpoint.architecture}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
            f"{c.num_attention_heads} heads, vocab {c.vocab_size}"
        )
        defaults = read_embedding_defaults(checkpoint_dir, c.max_position_embeddings)
        cross_encoder, defaults = pair_model(checkpoint, defaults, pairs)
        if fusion is not None:
            cross_encoder = with_fusion(cross_encoder, fusion, out_repo, checkpoint_dir)
        if cross_encoder is not None:
            notes.append(f"a CrossEncoder ({cross_encoder.activation}, max_length {defaults.max_length})")
        declared = embedding_options(checkpoint, defaults, cross_encoder, dimensions)
        notes.append(describe_options(declared))
        tokenizer = for_repository(load_tokenizer(checkpoint_dir), defaults.max_length)
        specials = special_tokens(checkpoint_dir, tokenizer)
        if checkpoint.architecture == MASKED_LM and specials.mask_token_id is None:
            raise ExportError(
                f"{checkpoint_dir}: a masked-LM checkpoint whose tokenizer has no {specials.mask_token!r}"
            )
    name = check_name(name or default_name(checkpoint_dir))
    shared, ranges = None, ({}, 0)
    if encoder is not None:
        if checkpoint.architecture == BASE:
            raise ExportError(
                f"{checkpoint_dir}: a {BASE} checkpoint has no head to put on encoder {encoder}"
            )
        shared = shared_encoder.resolve(out_repo, encoder)
        if shared.manifest.name == name:
            raise ExportError(f"--encoder {encoder}: a head-only model needs a name of its own (--name)")
        with tempfile.TemporaryDirectory(prefix="bertserve-tokenizer-") as scratch:
            tokenizer.save(str(Path(scratch) / TOKENIZER_FILE))
            spec = tokenizer_spec(specials, Path(scratch) / TOKENIZER_FILE)
        # the embedding options describe the encoder's outputs: the encoder model's, unless the checkpoint
        # declares others (then check_compatible names the difference)
        if declared == EmbeddingOptions():
            declared = options_of(shared.manifest.tasks.embed)
        embed = shared.manifest.tasks.embed
        ranges = (embed.calibration_ranges, embed.calibration_texts)
        tasks = tasks_for(
            checkpoint, defaults, specials, CLS_HIDDEN_STATE, pairs, cross_encoder, declared, ranges
        )
        shared_encoder.check_compatible(shared, dimensions_of(checkpoint), defaults.max_length, spec, tasks)
        with stages.stage(
            "shared_encoder", f"checking that {shared.label}'s encoder is this checkpoint's"
        ) as notes:
            worst = shared_encoder.check_encoder_outputs(shared, checkpoint, defaults.pooling, tolerance)
            notes.append(f"max |ORT - torch| {worst:.2e}")
    remove_stale_staging(out_repo / name, log)
    version = choose_version(out_repo, name, version)

    with (
        tempfile.TemporaryDirectory(prefix="bertserve-export-") as work,
        staged_version(out_repo, name, version) as stage_dir,
    ):
        ctx = ExportContext(checkpoint, defaults, tokenizer, specials, options, Path(work), stage_dir, shared)
        graphs = {v.key: build_variant(v, ctx, stages) for v in VARIANTS if v.wanted(ctx)}
        check_pairs(ctx, stages)
        if shared is None:
            with stages.stage("calibrate", "encoder: int8/uint8 calibration ranges") as notes:
                sizes = [c.hidden_size, *declared.dimensions]
                ranges = calibration.calibration_ranges(
                    ctx.fp32_path, tokenizer, specials.pad_token_id, sizes
                )
                notes.append(f"{len(ranges[0])} ranges from {ranges[1]} texts")
        with stages.stage("write", "writing tokenizer and manifest"):
            if shared is None:
                tokenizer.save(str(stage_dir / TOKENIZER_FILE))
                spec = tokenizer_spec(specials, stage_dir / TOKENIZER_FILE)
            else:  # a head-only model uses its encoder model's tokenizer (equal, checked above)
                spec = shared.manifest.tokenizer
            tasks = tasks_for(
                checkpoint, defaults, specials, ctx.classifier_input, pairs, cross_encoder, declared, ranges
            )
            if ctx.tied_decoder is not None:  # the mlm_head takes the encoder's table as an input
                fill_mask = tasks.fill_mask.model_copy(update={"tied_decoder": ctx.tied_decoder})
                tasks = tasks.model_copy(update={"fill_mask": fill_mask})
            manifest = build_manifest(
                name=name,
                version=version,
                checkpoint=checkpoint,
                source=source or checkpoint_dir.resolve().name,
                max_length=defaults.max_length,
                tokenizer=spec,
                tasks=tasks,
                graphs=graphs,
                seconds=stages.seconds,
                encoder=shared.reference() if shared is not None else None,
                pretraining=pretraining_info(checkpoint_dir),
            )
            manifest.write(stage_dir)
    final = out_repo / name / str(version)
    on = f" on encoder {shared.label}" if shared is not None else ""
    log(f"wrote {final} ({', '.join(graphs)}){on} in {sum(stages.seconds.values()):.1f} s")
    return final
