"""Repository files a process takes as checked without hashing them again.

With several processes (`--workers`), the supervisor hashes the served files once at start (its version
pin) and hands every engine and front what it checked, each file with its stamp (device, inode, size, and
modification and change times in nanoseconds); a child hashes only a file whose stamp has moved since, so a
file replaced or written in place is checked again: the change time moves with every write, every `utime`
(which can set the modification time back) and every new file. Within one process a file is hashed once.

As git does with its index, a file changed within RACY_NS of its hash is never remembered: file times come
from a coarse clock, so a same-size write in the same tick would keep the stamp. The stamp is read from an
open file, so a network file system (NFS: close-to-open) reports it afresh, not from its attribute cache.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bertserve.repository import check_file

Stamp = tuple[int, int, int, int, int]
Checked = dict[str, tuple[str, Stamp]]  # path -> (sha256, stamp when it was hashed)
RACY_NS = 2_000_000_000  # a file changed this recently when hashed is hashed again next time


def stamp(path: Path) -> Stamp | None:
    """The file's identity and version as the file system reports it; None when it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
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
        `sha256` and has not changed since; a file that did not change while hashed, nor just before, is
        remembered."""
        before = stamp(path)
        if before is not None and self._files.get(str(path)) == (sha256, before):
            return
        check_file(path, sha256, what)
        if before is not None and stamp(path) == before and time.time_ns() - max(before[3:]) > RACY_NS:
            self._files[str(path)] = (sha256, before)


CHECKED = CheckedFiles()  # this process's
