"""The server's folders under the temporary directory (service/supervisor/scratch.py): a run killed with
SIGKILL leaves its folders behind, and the next start removes them, never those of a server that lives."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bertserve.service.supervisor.scratch import OWNER_LOCK, PREFIX, ScratchDir, remove_stale
from tests.helpers.server import ServerProcess, wait_for

PIDS = re.compile(r"started (?:engine|front-\d+), pid (\d+)")
OWNER = """
import sys, time
from bertserve.service.supervisor.scratch import ScratchDir
made = ScratchDir("run")
print(made.path, flush=True)
time.sleep(3600)
"""


@pytest.fixture
def root(monkeypatch):
    """A short temporary directory of its own (a Unix socket's path has at most 107 bytes)."""
    path = tempfile.mkdtemp(prefix="bs", dir="/tmp")
    monkeypatch.setenv("TMPDIR", path)
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _owner(root: Path) -> tuple[subprocess.Popen, Path]:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(root)},
    )
    return owner, Path(owner.stdout.readline().strip())


def test_only_folders_whose_owner_is_gone_are_removed(root):
    mine = ScratchDir("relay")  # this process lives: its lock is held
    living, living_dir = _owner(root)
    killed, killed_dir = _owner(root)
    killed.send_signal(signal.SIGKILL)
    killed.wait(30)
    (root / f"{PREFIX}old").mkdir()  # no lock file: not one of ours
    (root / "other").mkdir()
    try:
        assert killed_dir.is_dir() and (killed_dir / OWNER_LOCK).is_file()
        assert remove_stale() == [str(killed_dir)]
        assert not killed_dir.exists() and living_dir.is_dir() and Path(mine.path).is_dir()
        assert {p.name for p in root.iterdir()} == {
            living_dir.name,
            Path(mine.path).name,
            f"{PREFIX}old",
            "other",
        }
    finally:
        living.kill()
        living.wait(30)
        mine.remove()
    assert remove_stale() == [str(living_dir)] and not Path(mine.path).exists()


def test_a_server_killed_leaves_its_folders_and_the_next_start_removes_them(tiny_repo, root):
    """Every process of a `--workers 2` server killed at once (as an OOM kill of its container does): the
    run's folder (engine socket, metric files) and each front's relay folder stay; the next start removes
    them and makes its own, which a clean stop removes."""
    args = (
        "--model-repo",
        str(tiny_repo),
        "--model",
        "tiny-embed",
        "--workers",
        "2",
        "--grpc-transport",
        "native",
    )
    env = {"TMPDIR": str(root)}
    first = ServerProcess(*args, env=env).start(timeout=120)
    left = _ours(root)
    assert len(left) == 3, left
    children = [int(pid) for pid in PIDS.findall(first.output)]
    for pid in [first.process.pid, *children]:
        os.kill(pid, signal.SIGKILL)
    first.process.wait(30)
    wait_for(lambda: _free_locks(root) == 3, timeout=30)  # every owner gone, nothing removed
    second = ServerProcess(*args, env=env).start(timeout=120)
    try:
        assert "removed 3 folder(s) of servers that are gone" in second.output
        now = _ours(root)
        assert not now & left and len(now) == 3
    finally:
        second.process.send_signal(signal.SIGTERM)
        assert second.process.wait(60) == 0
    assert not _ours(root)


def _ours(root: Path) -> set[str]:
    return {path.name for path in root.iterdir() if path.name.startswith(PREFIX)}  # gRPC's files aside


def _free_locks(root: Path) -> int:
    """Folders under `root` whose lock is free (a start would remove them), found without removing them."""
    count = 0
    for path in root.iterdir():
        try:
            lock = os.open(path / OWNER_LOCK, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            count += 1
        except OSError:
            pass
        finally:
            os.close(lock)
    return count
