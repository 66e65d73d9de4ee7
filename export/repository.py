"""Writing REPO/NAME/VERSION atomically: everything goes to a staging directory next to it, which is
renamed into place only when complete. A failed export leaves no version directory behind (and removes
the model and repository directories it created, if they are still empty)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bertserve.export.errors import ExportError
from bertserve.manifest import MANIFEST_FILE

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # as bertserve.manifest.Manifest.name


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ExportError(f"model name {name!r} is not allowed (letters, digits, '.', '_', '-'; at most 64)")
    return name


def existing_versions(model_dir: Path) -> list[int]:
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def choose_version(repo: Path, name: str, version: int | None) -> int:
    taken = existing_versions(Path(repo) / name)
    if version is None:
        return (taken[-1] + 1) if taken else 1
    if version < 1:
        raise ExportError(f"version must be >= 1, got {version}")
    if version in taken:
        raise ExportError(f"{Path(repo) / name / str(version)} already exists (choose another --version)")
    return version


@contextlib.contextmanager
def staged_version(repo: Path, name: str, version: int) -> Iterator[Path]:
    """Yields an empty staging directory; on success it becomes REPO/NAME/VERSION, on error it is removed."""
    repo, created = Path(repo), []
    for directory in (repo, repo / name):
        if not directory.exists():
            directory.mkdir()
            created.append(directory)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{version}-", dir=repo / name))
    staging.chmod(0o755)  # mkdtemp makes it private; a repository is read by the server's user
    try:
        yield staging
        if not (staging / MANIFEST_FILE).is_file():
            raise ExportError("internal error: the staged version has no manifest")
        final = repo / name / str(version)
        try:
            os.rename(staging, final)  # atomic; fails if the version appeared meanwhile
        except OSError as e:
            raise ExportError(f"{final}: cannot create ({e.strerror})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for directory in reversed(created):
            with contextlib.suppress(OSError):
                directory.rmdir()  # only when still empty
        raise
