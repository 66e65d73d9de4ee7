"""Repository files a process takes as checked without hashing them again.

With several processes (`--workers`), the supervisor hashes the served files once at start (its version
pin) and hands every engine and front what it checked, each file with its stamp (device, inode, size, and
modification and change times in nanoseconds); a child hashes only a file whose stamp has moved since, so a
file replaced or written in place is checked again: the change time moves on every write, every `utime`
(which can set the modification time back) and every new file, and no caller can set it. Within one process a file is hashed once as well.
"""

from __future__ import annotations

import os
from pathlib import Path

from bertserve.repository import check_file

Stamp = tuple[int, int, int, int, int]
Checked = dict[str, tuple[str, Stamp]]  # path -> (sha256, stamp when it was hashed)


def stamp(path: Path) -> Stamp | None:
    """The file's identity and version as the file system reports it; None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class CheckedFiles:
    def __init__(self):
        self._files: Checked = {}

    def trust(self, checked: Checked) -> None:
        """Takes `checked` (another process's `export`, its supervisor's) as this process's own."""
        self._files.update(checked)

    def export(self) -> Checked:
        return dict(self._files)

    def check(self, path: Path, sha256: str, what: str) -> None:
        """`check_file` (RepositoryError when missing or different), unless the file was hashed to
        `sha256` and has not changed since; a file that did not change while hashed is remembered."""
        before = stamp(path)
        if before is not None and self._files.get(str(path)) == (sha256, before):
            return
        check_file(path, sha256, what)
        if before is not None and stamp(path) == before:
            self._files[str(path)] = (sha256, before)


CHECKED = CheckedFiles()  # this process's
