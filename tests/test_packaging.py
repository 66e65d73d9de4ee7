"""The serving wheel's contents against the repository: pyproject's [tool.setuptools] maps the top-level
folders into the one namespace bertserve.*, and the wheel must carry every file of those folders that
git tracks (the committed head and pretraining weights, the bench's native source, the type stubs), and
nothing else. tests/test_packaging_wheel.py installs the wheel and runs the image's commands from it.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import PurePosixPath

import pytest
import tomllib

from tests.deploy_support import ROOT
from tests.helpers.wheel import build_wheel


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder_of(package: str, package_dir: dict[str, str]) -> PurePosixPath:
    """The repository folder a package name maps to (the longest mapped prefix wins)."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in package_dir:
            return PurePosixPath(package_dir[prefix], *parts[cut:])
    raise AssertionError(f"{package} is under no package-dir entry")


def _tracked(folder: str) -> list[PurePosixPath]:
    result = subprocess.run(
        ["git", "ls-files", "-z", "--", folder], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [PurePosixPath(name) for name in result.stdout.split("\0") if name]


def _expected_wheel_files() -> set[str]:
    """Each tracked file of a listed package's folder, at its path in the wheel."""
    config = _setuptools()
    folders = {_folder_of(p, config["package-dir"]): p for p in config["packages"]}
    expected = set()
    for top in {PurePosixPath(d) for d in config["package-dir"].values()}:
        for path in _tracked(str(top)):
            package = folders.get(path.parent)
            assert package is not None, f"{path}: its folder is no listed package, so the wheel leaves it out"
            expected.add(str(PurePosixPath(*package.split("."), path.name)))
    return expected


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_every_listed_package_is_a_folder_of_the_repository():
    config = _setuptools()
    for package in config["packages"]:
        assert (ROOT / _folder_of(package, config["package-dir"])).is_dir(), package


def test_the_wheel_carries_every_tracked_file_of_the_packaged_folders_and_nothing_else(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = {n for n in archive.namelist() if ".dist-info/" not in n}
    expected = _expected_wheel_files()
    assert names == expected, {"missing": sorted(expected - names), "extra": sorted(names - expected)}
    for weights in ("export/heads/weights/heads.json", "export/pretrain/weights/trained.safetensors"):
        assert f"bertserve/{weights}" in names  # what `bertserve export-default-heads` reads
