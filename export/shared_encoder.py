"""A head exported onto an encoder model already in the repository (`bertserve export --encoder NAME[:VERSION]`).

The head-only version holds its head graphs and a manifest naming the encoder model (name, version and the
sha256 of its manifest.json). Before anything is written, the export proves that the encoder model computes
this checkpoint's encoder: its fp32 graph is run by ONNX Runtime on the same shape grid as a full export and
compared with the checkpoint's PyTorch encoder (last_hidden_state and sentence_embedding, within the
tolerance); dimensions, max_length, the tokenizer and the embed task must be the encoder model's too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertserve.export import onnx_export, verify
from bertserve.export.checkpoint import Checkpoint
from bertserve.export.errors import ExportError
from bertserve.repository import (
    ENCODER,
    LAST_HIDDEN_STATE,
    MANIFEST_FILE,
    SENTENCE_EMBEDDING,
    EncoderRef,
    Manifest,
    ModelDimensions,
    RepositoryError,
    Tasks,
    TokenizerSpec,
    check_file,
    list_versions,
    parse_model_spec,
    read_manifest,
    sha256_file,
)

COMPARED_OUTPUTS = [LAST_HIDDEN_STATE, SENTENCE_EMBEDDING]  # a head checkpoint's pooler may be its own
# Tokenizer fields not compared: the file name, and the pair template, which the compared sha256 of the file
# already determines (an encoder model exported before pair templates were recorded has None).
_DERIVED = {"file", "pair_template"}


@dataclass(frozen=True)
class SharedEncoder:
    directory: Path  # REPO/NAME/VERSION of the encoder model
    manifest: Manifest

    @property
    def label(self) -> str:
        return f"{self.manifest.name}:{self.manifest.version}"

    @property
    def fp32_path(self) -> Path:
        return self.directory / self.manifest.graphs[ENCODER].file

    def reference(self) -> EncoderRef:
        return EncoderRef(
            name=self.manifest.name,
            version=self.manifest.version,
            manifest_sha256=sha256_file(self.directory / MANIFEST_FILE),
        )


def resolve(repo: Path, spec: str) -> SharedEncoder:
    """The encoder model `spec` (NAME or NAME:VERSION, default its highest version) of `repo`, checked."""
    try:
        name, version = parse_model_spec(spec)
        versions = list_versions(Path(repo) / name)
        if not versions:
            raise ExportError(f"--encoder {spec}: {Path(repo) / name} holds no exported version")
        if version is not None and version not in versions:
            raise ExportError(
                f"--encoder {spec}: {Path(repo) / name} has no version {version} (have {versions})"
            )
        directory = Path(repo) / name / str(version or versions[-1])
        manifest = read_manifest(directory)
        if manifest.encoder is not None:
            raise ExportError(
                f"--encoder {spec}: {directory} is head-only (on {manifest.encoder.name}); name its encoder model"
            )
        if ENCODER not in manifest.graphs:
            raise ExportError(f"--encoder {spec}: {directory / MANIFEST_FILE} lists no {ENCODER} graph")
        check_file(
            directory / manifest.graphs[ENCODER].file, manifest.graphs[ENCODER].sha256, "graph encoder"
        )
        check_file(directory / manifest.tokenizer.file, manifest.tokenizer.sha256, "tokenizer")
    except RepositoryError as exc:
        raise ExportError(f"--encoder {spec}: {exc}") from None
    return SharedEncoder(directory, manifest)


def check_compatible(
    shared: SharedEncoder,
    dimensions: ModelDimensions,
    max_length: int,
    tokenizer: TokenizerSpec,
    tasks: Tasks,
) -> None:
    """The head-only model's manifest fields that must equal the encoder model's (the server checks again)."""
    theirs = shared.manifest
    pairs = {
        "dimensions": (dimensions.model_dump(), theirs.dimensions.model_dump()),
        "max_length": ({"max_length": max_length}, {"max_length": theirs.max_length}),
        "embed task": (_dump(tasks.embed), _dump(theirs.tasks.embed)),
        "tokenizer": (tokenizer.model_dump(exclude=_DERIVED), theirs.tokenizer.model_dump(exclude=_DERIVED)),
    }
    for what, (mine, other) in pairs.items():
        if differing := [
            f"{k} {mine.get(k)} vs {other.get(k)}"
            for k in sorted(mine | other)
            if mine.get(k) != other.get(k)
        ]:
            raise ExportError(
                f"the checkpoint does not match encoder {shared.label} in {what} (checkpoint vs encoder): "
                f"{', '.join(differing)}"
            )


def _dump(model) -> dict:
    return model.model_dump() if model is not None else {}


def check_encoder_outputs(
    shared: SharedEncoder, checkpoint: Checkpoint, pooling: str, tolerance: float
) -> float:
    """Max |encoder model's fp32 graph - this checkpoint's PyTorch encoder| over the shape grid."""
    c = checkpoint.config
    module = onnx_export.EncoderGraph(checkpoint.encoder, pooling, with_pooler=False).eval()
    cases = verify.encoder_cases(module, shared.manifest.max_length, c.vocab_size, c.type_vocab_size)
    worst = verify.max_abs_diff(shared.fp32_path, cases, COMPARED_OUTPUTS)
    if not worst <= tolerance:
        raise ExportError(
            f"the checkpoint's encoder is not encoder {shared.label}'s: {shared.fp32_path} differs from it by "
            f"{worst:.3g} (> tolerance {tolerance:g}); export it as a full model (without --encoder)"
        )
    return worst
