"""Finds the models in a model repository and checks their files against the manifests.

Layout: REPO/NAME/VERSION/{manifest.json, tokenizer.json, *.onnx} (see bertserve/manifest.py). Every
problem is a `StartupError` naming the file: the server refuses to start rather than serve a model it
cannot trust.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from bertserve.manifest import ENCODER_ATTENTIONS, ENCODER_BY_PRECISION, MANIFEST_FILE, Manifest, sha256_file
from bertserve.service.errors import StartupError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFiles:
    """One model version whose manifest parsed and whose needed files match their sha256."""

    name: str
    version: int
    directory: Path
    manifest: Manifest
    encoder_key: str  # the graph key of the encoder for the chosen precision

    def graph_path(self, key: str) -> Path:
        return self.directory / self.manifest.graphs[key].file

    @property
    def tokenizer_path(self) -> Path:
        return self.directory / self.manifest.tokenizer.file


def _versions(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def _read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise StartupError(f"{path}: missing (every model version directory needs a {MANIFEST_FILE})")
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise StartupError(f"{path}: invalid manifest at {where}: {first['msg']}") from None


def _check_file(path: Path, sha256: str, what: str) -> None:
    if not path.is_file():
        raise StartupError(f"{path}: {what} listed in the manifest is missing")
    actual = sha256_file(path)
    if actual != sha256:
        raise StartupError(f"{path}: sha256 {actual[:16]}... does not match the manifest's {sha256[:16]}...")


def needed_graphs(manifest: Manifest, precision: str) -> tuple[str, list[str]]:
    """(encoder key, every graph key the server will load) for `precision`."""
    encoder_key = ENCODER_BY_PRECISION[precision]
    if encoder_key not in manifest.graphs:
        have = ", ".join(sorted(manifest.graphs)) or "none"
        raise StartupError(
            f"model {manifest.name} version {manifest.version} has no {encoder_key} graph for precision "
            f"{precision} (graphs: {have}); export it or set precision fp32"
        )
    keys = [encoder_key]
    if manifest.tasks.fill_mask is not None:
        keys.append(manifest.tasks.fill_mask.graph)
    if manifest.tasks.classify is not None:
        keys.append(manifest.tasks.classify.graph)
    if ENCODER_ATTENTIONS in manifest.graphs:  # served by the Attention RPC
        keys.append(ENCODER_ATTENTIONS)
    for key in keys:
        if key not in manifest.graphs:
            raise StartupError(f"model {manifest.name}: a task needs graph {key!r}, which the manifest lacks")
    outputs = {o.name for o in manifest.graphs[encoder_key].outputs}
    if manifest.tasks.classify is not None and "pooler_output" not in outputs:
        raise StartupError(f"model {manifest.name}: classify needs pooler_output from {encoder_key}")
    return encoder_key, keys


def load_model_files(directory: Path, precision: str) -> ModelFiles:
    manifest = _read_manifest(directory)
    if manifest.name != directory.parent.name or str(manifest.version) != directory.name:
        raise StartupError(
            f"{directory / MANIFEST_FILE}: says {manifest.name} version {manifest.version}, "
            f"but lies in {directory.parent.name}/{directory.name}"
        )
    encoder_key, keys = needed_graphs(manifest, precision)
    _check_file(directory / manifest.tokenizer.file, manifest.tokenizer.sha256, "tokenizer")
    for key in keys:
        spec = manifest.graphs[key]
        _check_file(directory / spec.file, spec.sha256, f"graph {key}")
    return ModelFiles(manifest.name, manifest.version, directory, manifest, encoder_key)


def discover(repo: Path, specs: list[tuple[str, int | None]], precision: str) -> list[ModelFiles]:
    """The models to serve, in order: `specs` (name, version or None = highest) or every model by name."""
    repo = Path(repo)
    if not repo.is_dir():
        raise StartupError(f"model repository {repo}: no such directory")
    if not specs:
        specs = [(p.name, None) for p in sorted(repo.iterdir()) if p.is_dir() and not p.name.startswith(".")]
        if not specs:
            raise StartupError(f"model repository {repo}: holds no model directories")
    found = []
    for name, version in specs:
        model_dir = repo / name
        if not model_dir.is_dir():
            raise StartupError(f"model repository {repo}: no model named {name}")
        versions = _versions(model_dir)
        if not versions:
            raise StartupError(f"{model_dir}: holds no numbered version directories")
        if version is not None and version not in versions:
            raise StartupError(f"{model_dir}: no version {version} (have {versions})")
        chosen = version if version is not None else versions[-1]
        files = load_model_files(model_dir / str(chosen), precision)
        log.info("model %s version %s: manifest and sha256 checked (%s)", name, chosen, files.encoder_key)
        found.append(files)
    return found
