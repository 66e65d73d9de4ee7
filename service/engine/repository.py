"""Finds the models to serve in a model repository and checks their files (the contract:
bertserve/repository.py).

A head-only model is resolved to the encoder model it names: its `ModelFiles` point at that model's encoder
graphs and tokenizer, after checking the encoder's manifest against the reference's sha256 and the two
manifests' dimensions, max_length, tokenizer and embed task against each other.

What stops the server (a `StartupError`, one line naming the file): a model or version named explicitly that
is broken, a model none of whose versions is complete, no model at all. What does not: entries of the
repository that are not models (logged once at WARNING), and a broken newer version when an older version
of that model is complete (the older one is served, with a WARNING naming what is wrong with the newer).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from bertserve.repository import (
    ENCODER_ATTENTIONS,
    ENCODER_BY_PRECISION,
    ENCODER_KEYS,
    HEAD_KEYS,
    MANIFEST_FILE,
    NAME_PATTERN,
    Manifest,
    RepositoryError,
    is_staging,
    is_version_name,
    list_versions,
    read_manifest,
    sha256_file,
)
from bertserve.service.engine.checked_files import CHECKED
from bertserve.service.errors import StartupError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFiles:
    """One model version to serve, every file it needs checked against its sha256 (see /docs: repository)."""

    name: str
    version: int
    directory: Path  # this model's own version directory
    manifest: Manifest  # effective: own tasks/dimensions/tokenizer; graphs = the encoder model's + own heads
    encoder_key: str  # the graph key of the encoder for the chosen precision
    own_manifest: Manifest  # as written in `directory`
    encoder_name: str  # the model whose encoder graphs run (this model itself unless it is head-only)
    encoder_version: int
    tokenizer_path: Path
    paths: dict[str, Path] = field(repr=False)  # every graph key of `manifest` -> its file
    decoder_table_path: Path | None = None  # a tied mlm_head's decoder table (.npy), checked

    def graph_path(self, key: str) -> Path:
        return self.paths[key]

    @property
    def shares_encoder(self) -> bool:
        return self.own_manifest.encoder is not None

    @property
    def encoder_path(self) -> Path:
        return self.paths[self.encoder_key]

    @property
    def encoder_sha256(self) -> str:
        return self.manifest.graphs[self.encoder_key].sha256

    @property
    def attentions_path(self) -> Path | None:
        return self.paths.get(ENCODER_ATTENTIONS)

    @property
    def head_paths(self) -> dict[str, Path]:
        tasks = self.manifest.tasks
        keys = [task.graph for task in (tasks.fill_mask, tasks.classify) if task is not None]
        return {key: self.paths[key] for key in keys}


def needed_graphs(manifest: Manifest, precision: str) -> tuple[str, list[str]]:
    """(encoder key, every graph key the server will load) for `precision`, from an effective manifest."""
    encoder_key = ENCODER_BY_PRECISION[precision]
    if encoder_key not in manifest.graphs:
        have = ", ".join(sorted(manifest.graphs)) or "none"
        raise StartupError(
            f"model {manifest.name} version {manifest.version} has no {encoder_key} graph for precision "
            f"{precision} (graphs: {have}); export it or set precision fp32"
        )
    keys = [encoder_key]
    tasks = manifest.tasks
    keys += [task.graph for task in (tasks.fill_mask, tasks.classify) if task is not None]
    if ENCODER_ATTENTIONS in manifest.graphs:  # served by the Attention RPC
        keys.append(ENCODER_ATTENTIONS)
    for key in keys:
        if key not in manifest.graphs:
            raise StartupError(f"model {manifest.name}: a task needs graph {key!r}, which the manifest lacks")
    outputs = {o.name for o in manifest.graphs[encoder_key].outputs}
    classify = tasks.classify
    if classify is not None and classify.encoder_output == "pooler_output" and "pooler_output" not in outputs:
        raise StartupError(f"model {manifest.name}: classify needs pooler_output from {encoder_key}")
    return encoder_key, keys


class _Loader:
    """Loads version directories of one repository; hashes each file once per discovery."""

    def __init__(self, repo: Path, precision: str):
        self.repo, self.precision = repo, precision
        self._checked: set[tuple[Path, str]] = set()

    def _check(self, path: Path, sha256: str, what: str) -> None:
        if (path, sha256) not in self._checked:
            CHECKED.check(path, sha256, what)  # hashed unless this process (or its supervisor) did
            self._checked.add((path, sha256))

    def _manifest_at(self, directory: Path) -> Manifest:
        manifest = read_manifest(directory)
        if manifest.name != directory.parent.name or str(manifest.version) != directory.name:
            raise RepositoryError(
                f"{directory / MANIFEST_FILE}: says {manifest.name} version {manifest.version}, "
                f"but lies in {directory.parent.name}/{directory.name}"
            )
        return manifest

    def _encoder_of(self, own: Manifest, directory: Path) -> tuple[Manifest, Path]:
        """The encoder model a head-only manifest names, checked against the reference and the manifest."""
        ref, own_path = own.encoder, directory / MANIFEST_FILE
        encoder_dir = self.repo / ref.name / str(ref.version)
        path = encoder_dir / MANIFEST_FILE
        what = f"model {own.name} version {own.version}'s encoder"
        if not path.is_file():
            raise RepositoryError(f"{path}: missing ({what} {ref.name} version {ref.version})")
        actual = sha256_file(path)
        if actual != ref.manifest_sha256:
            raise RepositoryError(
                f"{path}: sha256 {actual[:16]}... does not match {what} reference "
                f"{ref.manifest_sha256[:16]}... in {own_path} (was the encoder re-exported?)"
            )
        encoder = self._manifest_at(encoder_dir)
        if encoder.encoder is not None:
            raise RepositoryError(f"{own_path}: encoder {ref.name} version {ref.version} is itself head-only")
        for attribute in ("dimensions", "max_length", "tokenizer"):
            if getattr(own, attribute) != getattr(encoder, attribute):
                raise RepositoryError(f"{own_path}: {attribute} differs from its encoder's ({path})")
        if own.tasks.embed != encoder.tasks.embed:
            raise RepositoryError(f"{own_path}: tasks.embed differs from its encoder's ({path})")
        if stray := [key for key in own.graphs if key not in HEAD_KEYS]:
            raise RepositoryError(f"{own_path}: a head-only model lists encoder graphs {stray}")
        return encoder, encoder_dir

    def load(self, directory: Path) -> ModelFiles:
        try:
            return self._load(directory)
        except RepositoryError as exc:
            raise StartupError(str(exc)) from None

    def _load(self, directory: Path) -> ModelFiles:
        own = self._manifest_at(directory)
        encoder, encoder_dir = (own, directory) if own.encoder is None else self._encoder_of(own, directory)
        encoder_graphs = {k: v for k, v in encoder.graphs.items() if k in ENCODER_KEYS}
        manifest = own.model_copy(update={"graphs": {**encoder_graphs, **own.graphs}})
        paths = {key: encoder_dir / spec.file for key, spec in encoder_graphs.items()}
        paths |= {key: directory / spec.file for key, spec in own.graphs.items()}
        encoder_key, keys = needed_graphs(manifest, self.precision)
        tokenizer_path = encoder_dir / encoder.tokenizer.file
        self._check(tokenizer_path, encoder.tokenizer.sha256, "tokenizer")
        for key in keys:
            self._check(paths[key], manifest.graphs[key].sha256, f"graph {key}")
        tied = own.tasks.tied_decoder
        decoder_table_path = directory / tied.file if tied is not None else None
        if tied is not None:
            self._check(decoder_table_path, tied.sha256, "tied decoder table")
        return ModelFiles(
            name=own.name,
            version=own.version,
            directory=directory,
            manifest=manifest,
            encoder_key=encoder_key,
            own_manifest=own,
            encoder_name=encoder.name,
            encoder_version=encoder.version,
            tokenizer_path=tokenizer_path,
            paths=paths,
            decoder_table_path=decoder_table_path,
        )

    def newest_complete(self, model_dir: Path) -> ModelFiles:
        """The highest version that loads; a broken newer one is skipped with a WARNING naming the fault."""
        versions = list_versions(model_dir)
        skipped: list[str] = []
        for version in reversed(versions):
            try:
                files = self.load(model_dir / str(version))
            except StartupError as exc:
                skipped.append(str(exc))
                continue
            for fault in skipped:
                log.warning(
                    "model %s: serving version %s; a newer version is broken: %s", files.name, version, fault
                )
            return files
        if len(skipped) > 1:
            raise StartupError(f"{skipped[0]} (and no older version of {model_dir.name} is complete)")
        raise StartupError(skipped[0])


def _warn_about_strays(model_dir: Path) -> None:
    for entry in sorted(model_dir.iterdir()):
        if is_version_name(entry.name) and entry.is_dir():
            continue
        if is_staging(entry.name):
            log.warning("%s: an unfinished export, ignored (the next export of this model removes it)", entry)
        else:
            log.warning("%s: not a version directory, ignored", entry)


def model_directories(repo: Path) -> list[Path]:
    """REPO's model directories by name; whatever is not one is logged once at WARNING and ignored
    (hidden entries, such as the Makefile's stamp `.default-exported`, silently)."""
    models = []
    for entry in sorted(repo.iterdir()):
        if entry.name.startswith("."):
            continue
        if not entry.is_dir() or not NAME_PATTERN.match(entry.name):
            log.warning("%s: not a model directory, ignored", entry)
        elif not list_versions(entry):
            log.warning("%s: holds no numbered version directories, ignored", entry)
            _warn_about_strays(entry)
        else:
            _warn_about_strays(entry)
            models.append(entry)
    return models


def discover(repo: Path, specs: list[tuple[str, int | None]], precision: str) -> list[ModelFiles]:
    """The models to serve, in order: `specs` (name, version or None = newest complete) or every model by name."""
    repo = Path(repo)
    if not repo.is_dir():
        raise StartupError(f"model repository {repo}: no such directory")
    loader = _Loader(repo, precision)
    found = []
    if not specs:
        model_dirs = model_directories(repo)
        if not model_dirs:
            raise StartupError(f"model repository {repo}: holds no model directories")
        found = [loader.newest_complete(model_dir) for model_dir in model_dirs]
    for name, version in specs:
        model_dir = repo / name
        if not model_dir.is_dir():
            raise StartupError(f"model repository {repo}: no model named {name}")
        versions = list_versions(model_dir)
        if not versions:
            raise StartupError(f"{model_dir}: holds no numbered version directories")
        if version is None:
            found.append(loader.newest_complete(model_dir))
        elif version not in versions:
            raise StartupError(f"{model_dir}: no version {version} (have {versions})")
        else:
            found.append(loader.load(model_dir / str(version)))
    for files in found:
        on = f", encoder {files.encoder_name}:{files.encoder_version}" if files.shares_encoder else ""
        log.info(
            "model %s version %s: manifest and sha256 checked (%s%s)",
            files.name,
            files.version,
            files.encoder_key,
            on,
        )
    return found
