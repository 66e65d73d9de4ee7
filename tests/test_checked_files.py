"""Repository files hashed once (service/engine/checked_files.py): a file checked by this process or handed
over by the supervisor is not hashed again while its stamp stays; a file replaced or written since is."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from bertserve.repository import RepositoryError
from bertserve.service.engine import checked_files, repository
from bertserve.service.engine.checked_files import CheckedFiles
from bertserve.service.errors import StartupError


@pytest.fixture
def hashed(monkeypatch) -> list:
    """The paths `check_file` hashes, in order; files written just now count as settled."""
    monkeypatch.setattr(checked_files, "RACY_NS", -(10**12))
    calls = []
    real = checked_files.check_file

    def counting(path, sha256, what):
        calls.append(path.name)
        real(path, sha256, what)

    monkeypatch.setattr(checked_files, "check_file", counting)
    return calls


def test_a_file_is_hashed_again_only_when_it_changed(tmp_path, hashed):
    path = tmp_path / "graph.onnx"
    path.write_bytes(b"weights" * 100)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    supervisor = CheckedFiles()
    supervisor.check(path, sha, "graph")
    child = CheckedFiles()
    child.trust(supervisor.export())
    child.check(path, sha, "graph")  # as the supervisor hashed it: taken
    assert hashed == ["graph.onnx"]
    with pytest.raises(RepositoryError, match="does not match"):
        child.check(path, "0" * 64, "graph")  # another sha256 than the one vouched for: hashed
    stat = os.stat(path)
    path.write_bytes(b"WEIGHTS" * 100)  # same size, written in place, its times set back
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(RepositoryError, match="does not match"):
        child.check(path, sha, "graph")
    replaced = tmp_path / "other.onnx"
    replaced.write_bytes(b"weights" * 100)
    os.utime(replaced, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same size and time, another file
    os.replace(replaced, path)
    child.check(path, sha, "graph")  # hashed again (another inode), and equal
    assert hashed == ["graph.onnx"] * 4


def test_a_file_changed_just_before_its_hash_is_hashed_again(tmp_path):
    path = tmp_path / "graph.onnx"
    path.write_bytes(b"weights")  # now: within RACY_NS of the hash, a same-tick write could keep its stamp
    files = CheckedFiles()
    files.check(path, hashlib.sha256(b"weights").hexdigest(), "graph")
    assert files.export() == {}


def test_a_missing_file_is_never_taken(tmp_path):
    path = tmp_path / "gone.onnx"
    path.write_bytes(b"x")
    files = CheckedFiles()
    files.check(path, hashlib.sha256(b"x").hexdigest(), "graph")
    path.unlink()
    with pytest.raises(RepositoryError, match="missing"):
        files.check(path, hashlib.sha256(b"x").hexdigest(), "graph")


def test_a_child_given_the_supervisors_checks_hashes_nothing(tiny_repo, tmp_path, hashed, monkeypatch):
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo)
    monkeypatch.setattr(checked_files, "CHECKED", CheckedFiles())
    monkeypatch.setattr(repository, "CHECKED", checked_files.CHECKED)
    found = repository.discover(repo, [], "fp32")
    first = len(hashed)
    assert first >= len(found)
    handed = checked_files.CHECKED.export()
    child = CheckedFiles()  # a new process's, given what its supervisor checked
    child.trust(handed)
    monkeypatch.setattr(repository, "CHECKED", child)
    assert [f.name for f in repository.discover(repo, [], "fp32")] == [f.name for f in found]
    assert len(hashed) == first
    changed = next(iter(handed))
    with open(changed, "r+b") as f:  # one byte of a file changed after the supervisor's check
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(StartupError, match="does not match"):  # hashed again, and refused
        repository.discover(repo, [], "fp32")


def test_the_supervisor_hands_its_checks_to_every_child(tiny_repo, monkeypatch):
    from bertserve.service.settings import load_settings
    from bertserve.service.supervisor import processes

    monkeypatch.setattr(checked_files, "CHECKED", CheckedFiles())
    monkeypatch.setattr(checked_files, "RACY_NS", -(10**12))  # the repository was written just now
    monkeypatch.setattr(repository, "CHECKED", checked_files.CHECKED)
    monkeypatch.setattr(processes, "CHECKED", checked_files.CHECKED)
    settings = load_settings(model_repo=tiny_repo, metrics_port=-1, http_port=-1)
    supervisor = processes.Supervisor(settings, 2)  # pins the versions: hashes every served file
    started = {}
    monkeypatch.setattr(supervisor, "_start", lambda name, target, *args: started.setdefault(name, args))
    try:
        supervisor._start_front(settings, 0)
    finally:
        supervisor._scratch.remove()
    front_checked = started["front-0"][-1]
    assert front_checked == checked_files.CHECKED.export() and len(front_checked) >= 3
    assert all(path.startswith(str(tiny_repo)) for path in front_checked)
