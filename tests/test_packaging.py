"""The wheels' contents against the repository. pyproject's [tool.setuptools] maps the top-level folders
bertserve/, service/ and export/ into the one namespace bertserve.*; bench/ is bertserve.bench, the
distribution bertserve-bench of its own (bench/pyproject.toml). Each wheel must carry every file of its
folders that git tracks (the committed head and pretraining weights, the bench's native source and
corpus, the type stubs), and nothing else: the serving wheel no benchmark.
tests/test_packaging_wheel.py installs the serving wheel and runs the image's commands from it.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path, PurePosixPath

import pytest
import tomllib

from tests.deploy_support import ROOT
from tests.helpers.wheel import build_project_wheel, build_wheel

PROJECTS = {"bertserve": ROOT, "bertserve-bench": ROOT / "bench", "bertserve-train": ROOT / "train"}


def _setuptools(project: Path) -> dict:
    return tomllib.loads((project / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder_of(package: str, package_dir: dict[str, str]) -> PurePosixPath:
    """The folder (relative to the project) a package name maps to; the longest mapped prefix wins."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in package_dir:
            return PurePosixPath(package_dir[prefix], *parts[cut:])
    raise AssertionError(f"{package} is under no package-dir entry")


def _tracked(project: Path, folder: PurePosixPath) -> list[PurePosixPath]:
    """Tracked files under FOLDER of PROJECT, relative to the project; a nested project's pyproject.toml
    is not one of its package's files."""
    result = subprocess.run(
        ["git", "ls-files", "-z", "--", str(folder)], cwd=project, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [PurePosixPath(name) for name in result.stdout.split("\0") if name and name != "pyproject.toml"]


def _expected_wheel_files(project: Path) -> set[str]:
    """Each tracked file of a listed package's folder, at its path in the wheel."""
    config = _setuptools(project)
    folders = {_folder_of(p, config["package-dir"]): p for p in config["packages"]}
    expected = set()
    for top in {PurePosixPath(d) for d in config["package-dir"].values()}:
        for path in _tracked(project, top):
            package = folders.get(path.parent)
            assert package is not None, f"{path}: its folder is no listed package, so the wheel leaves it out"
            expected.add(str(PurePosixPath(*package.split("."), path.name)))
    return expected


@pytest.fixture(scope="module", params=list(PROJECTS))
def wheel(request, tmp_path_factory) -> tuple[Path, Path]:
    project, work = PROJECTS[request.param], tmp_path_factory.mktemp("wheel")
    return project, build_wheel(work) if project == ROOT else build_project_wheel(project, work)


@pytest.mark.parametrize("project", PROJECTS.values(), ids=list(PROJECTS))
def test_every_listed_package_is_a_folder_of_the_project(project):
    config = _setuptools(project)
    for package in config["packages"]:
        assert (project / _folder_of(package, config["package-dir"])).is_dir(), package


def test_the_wheel_carries_every_tracked_file_of_its_folders_and_nothing_else(wheel):
    project, path = wheel
    with zipfile.ZipFile(path) as archive:
        names = {n for n in archive.namelist() if ".dist-info/" not in n}
        size = sum(info.file_size for info in archive.infolist())
    expected = _expected_wheel_files(project)
    assert names == expected, {"missing": sorted(expected - names), "extra": sorted(names - expected)}
    print(
        f"{path.name}: {len(names)} files, {size / 2**20:.2f} MiB unpacked, {path.stat().st_size / 2**20:.2f} MiB"
    )


def test_the_serving_wheel_holds_what_export_default_heads_reads_and_no_benchmark():
    serving = _expected_wheel_files(ROOT)
    for weights in ("export/heads/weights/heads.json", "export/pretrain/weights/trained.safetensors"):
        assert f"bertserve/{weights}" in serving
    assert not any(name.startswith("bertserve/bench/") for name in serving)
    # the native transport, built where it runs: its source and the headers it includes
    for source in ("transport.cc", "relay.h", "call.h", "transport.h", "reactor.h"):
        assert f"bertserve/service/grpc/native/{source}" in serving
    assert "bertserve/bench/native/loadgen.cc" in _expected_wheel_files(PROJECTS["bertserve-bench"])


def test_the_bench_extra_installs_the_bench_distribution():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bench = tomllib.loads((ROOT / "bench" / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["bench"] == [f"{bench['name']}=={bench['version']}"]
    assert f"bertserve[export]=={project['version']}" in bench["dependencies"]
