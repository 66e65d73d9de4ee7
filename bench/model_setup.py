"""What the bench measures: the model picked from the repository, its checkpoint, and its int8 graph.

The naive baseline needs the Hugging Face checkpoint the repository was exported from: `--checkpoint`,
or the default model's files when the repository holds the default model. When the repository has no
int8 encoder, the bench exports one (from that checkpoint) into a temporary repository.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bertserve.bench.processes import BenchError
from bertserve.manifest import ENCODER, ENCODER_INT8, Manifest, sha256_file


@dataclass(frozen=True)
class ModelUnderTest:
    repo: Path  # the repository the fp32 servers load
    name: str
    version: int
    manifest: Manifest
    checkpoint: Path | None  # for the naive server and the int8 export; None: both skipped
    int8_repo: Path | None  # a repository whose version of the model has an int8 encoder; None: skipped
    int8_manifest: Manifest | None

    @property
    def directory(self) -> Path:
        return self.repo / self.name / str(self.version)

    @property
    def spec(self) -> str:
        return f"{self.name}:{self.version}"

    def graph(self, key: str) -> Path:
        if key == ENCODER_INT8:
            assert self.int8_repo is not None and self.int8_manifest is not None
            return self.int8_repo / self.name / str(self.version) / self.int8_manifest.graphs[key].file
        return self.directory / self.manifest.graphs[key].file

    @property
    def tokenizer_path(self) -> Path:
        return self.directory / self.manifest.tokenizer.file


def _pick(repo: Path, name: str | None) -> tuple[str, int, Manifest]:
    found = []
    for manifest_path in sorted(repo.glob("*/*/manifest.json")):
        version_dir = manifest_path.parent
        if version_dir.name.isdigit() and (name is None or version_dir.parent.name == name):
            found.append((version_dir.parent.name, int(version_dir.name)))
    if not found:
        raise BenchError(
            f"{repo}: no model{f' named {name}' if name else ''} (expected NAME/VERSION/manifest.json)"
        )
    candidates = []
    for model in sorted({n for n, _ in found}):
        version = max(v for n, v in found if n == model)
        manifest = Manifest.read(repo / model / str(version))
        if manifest.tasks.embed is not None and ENCODER in manifest.graphs:
            candidates.append((model, version, manifest))
    if not candidates:
        raise BenchError(f"{repo}: no model with the embed task and an fp32 encoder")
    return candidates[0]


def _default_checkpoint(manifest: Manifest) -> Path | None:
    """The default model's checkpoint for a repository exported from it; None where its package is not
    installed (a serving-only install: the naive baseline and any int8 export are then skipped)."""
    from bertserve.export.default_model import DEFAULT_SOURCE, default_checkpoint_dir
    from bertserve.export.errors import ExportError

    if manifest.export.source != DEFAULT_SOURCE:
        return None
    try:
        return default_checkpoint_dir()
    except ExportError:
        return None


def resolve_model(
    repo: Path, name: str | None, checkpoint: Path | None, scratch: Path, log: Callable[[str], None]
) -> ModelUnderTest:
    name, version, manifest = _pick(repo, name)
    directory = repo / name / str(version)
    _check_file(directory / manifest.tokenizer.file, manifest.tokenizer.sha256)
    _check_file(directory / manifest.graphs[ENCODER].file, manifest.graphs[ENCODER].sha256)
    checkpoint = checkpoint or _default_checkpoint(manifest)
    if checkpoint is None:
        log(
            f"no checkpoint for {name} (pass --checkpoint): the naive baseline and any int8 export are skipped"
        )
    int8_repo, int8_manifest = None, None
    if ENCODER_INT8 in manifest.graphs:
        int8_repo, int8_manifest = repo, manifest
    elif checkpoint is not None:
        from bertserve.export.pipeline import export_model

        log(
            f"{name}:{version} has no int8 encoder: exporting one from {checkpoint} into a temporary repository"
        )
        int8_repo = scratch / "int8-repository"
        export_model(checkpoint, int8_repo, name=name, version=version, int8=True, log=lambda _: None)
        int8_manifest = Manifest.read(int8_repo / name / str(version))
    model = ModelUnderTest(repo, name, version, manifest, checkpoint, int8_repo, int8_manifest)
    if int8_manifest is not None:
        _check_file(model.graph(ENCODER_INT8), int8_manifest.graphs[ENCODER_INT8].sha256)
    return model


def _check_file(path: Path, expected_sha256: str) -> None:
    """The in-process ceiling reads graphs directly: hold them to the manifest as the server does."""
    if not path.is_file():
        raise BenchError(f"{path}: listed in the manifest but missing")
    if sha256_file(path) != expected_sha256:
        raise BenchError(f"{path}: sha256 differs from the manifest's")
