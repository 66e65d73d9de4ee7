"""Writing REPO/NAME/VERSION atomically (names and layout: bertserve/repository.py). Everything goes to a
staging directory next to it, renamed into place only when complete. A failed export leaves no version
directory behind (and removes the model and repository directories it created, if still empty).

A killed export leaves its staging directory; the next export of the same model removes the stale ones:
those whose owner process (the pid in the name) is gone from this machine, and those without a pid in
their name (an older naming) once older than STALE_AFTER_S. A staging directory whose owner still runs is
kept, however old: that export may still be going.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bertserve.export.errors import ExportError
from bertserve.repository import (
    MANIFEST_FILE,
    NAME_PATTERN,
    is_staging,
    list_versions,
    staging_owner_pid,
    staging_prefix,
)

STALE_AFTER_S = 600


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ExportError(f"model name {name!r} is not allowed (letters, digits, '.', '_', '-'; at most 64)")
    return name


def choose_version(repo: Path, name: str, version: int | None) -> int:
    taken = list_versions(Path(repo) / name)
    if version is None:
        return (taken[-1] + 1) if taken else 1
    if version < 1:
        raise ExportError(f"version must be >= 1, got {version}")
    if version in taken:
        raise ExportError(f"{Path(repo) / name / str(version)} already exists (choose another --version)")
    return version


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


def is_stale(staging: Path, now: float | None = None) -> bool:
    pid = staging_owner_pid(staging.name)
    if pid is not None:
        return pid != os.getpid() and not _process_exists(pid)
    age = (time.time() if now is None else now) - staging.stat().st_mtime
    return age > STALE_AFTER_S


def remove_stale_staging(model_dir: Path, log: Callable[[str], None]) -> list[Path]:
    """Removes REPO/NAME's stale staging directories (see the module's doc); returns what it removed."""
    removed = []
    if not model_dir.is_dir():
        return removed
    for entry in sorted(model_dir.iterdir()):
        if is_staging(entry.name) and entry.is_dir() and is_stale(entry):
            shutil.rmtree(entry, ignore_errors=True)
            log(f"removed {entry} (left by an export that did not finish)")
            removed.append(entry)
    return removed


@contextlib.contextmanager
def staged_version(repo: Path, name: str, version: int) -> Iterator[Path]:
    """Yields an empty staging directory; on success it becomes REPO/NAME/VERSION, on error it is removed."""
    repo, created = Path(repo), []
    for directory in (repo, repo / name):
        if not directory.exists():
            directory.mkdir()
            created.append(directory)
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix(version), dir=repo / name))
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
