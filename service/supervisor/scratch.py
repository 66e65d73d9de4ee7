"""The server's private folders under the temporary directory (a run's engine socket and metric files, a
front's relay socket), and those of runs killed before they removed theirs.

Each folder holds OWNER_LOCK, flock()ed by the process that made it for as long as it lives; the kernel
lets go of the lock when that process dies, however it dies. A SIGKILL or an OOM kill leaves the folder
behind (in a Deployment /tmp is an emptyDir that outlives the container, with a size limit), so each start
removes this user's folders whose lock it can take. A lock file appears under its name already locked, so
a folder another server is still making is never taken for a dead one's; locks hold across containers that
share the folder, where process ids would not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

PREFIX = "bertserve-"
OWNER_LOCK = "owner.lock"


class ScratchDir:
    """A private (0700) folder named PREFIX + `kind`, locked by this process until `remove`."""

    def __init__(self, kind: str):
        self.path = tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-")
        making = os.path.join(self.path, f".{OWNER_LOCK}")
        self._lock = os.open(making, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        os.rename(making, os.path.join(self.path, OWNER_LOCK))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self._lock)


def remove_stale(root: str | None = None) -> list[str]:
    """Removes this user's folders (PREFIX*, holding OWNER_LOCK) whose owner is gone; returns their paths."""
    root = root or tempfile.gettempdir()
    removed = []
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            if entry.name.startswith(PREFIX) and _owner_gone(entry):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed


def _owner_gone(entry: os.DirEntry) -> bool:
    try:
        if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
            return False
        lock = os.open(os.path.join(entry.path, OWNER_LOCK), os.O_RDWR | os.O_NOFOLLOW)
    except OSError:  # no lock file: not one of ours, or from a version before them
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:  # held: its owner lives
        return False
    finally:
        os.close(lock)
