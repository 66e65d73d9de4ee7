"""`bertserve bench --cores`: the CPU order, the pinning of servers, and one tiny end-to-end run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from bertserve.bench.processes import ServerProcess
from bertserve.bench.scaling import cpu_order, layouts
from bertserve.cli import main


@pytest.mark.parametrize(
    ("topology", "expected"),
    [
        # two cores with two threads each, siblings numbered apart (0/2, 1/3): one per core first
        ({0: (0, 0), 1: (0, 1), 2: (0, 0), 3: (0, 1)}, [0, 1, 2, 3]),
        # siblings numbered next to each other (0/1, 2/3)
        ({0: (0, 0), 1: (0, 0), 2: (0, 1), 3: (0, 1)}, [0, 2, 1, 3]),
        # two packages whose core ids repeat: four distinct cores
        ({0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1)}, [0, 1, 2, 3]),
        ({}, [0, 1, 2, 3]),  # no topology: every CPU its own core
    ],
)
def test_cpu_order_takes_one_cpu_per_physical_core_first(topology, expected):
    assert cpu_order({0, 1, 2, 3}, topology) == expected


def test_layouts_are_one_session_of_k_threads_and_k_sessions_of_one():
    assert layouts(4) == {"1x4": (1, 4), "4x1": (4, 1)}
    assert layouts(1) == {"1x1": (1, 1)}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell pinned from not")
def test_a_pinned_server_process_runs_on_its_cpus_only(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    argv = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    server = ServerProcess("probe", argv, 0, tmp_path / "probe.log", cpus=[cpu])
    done = subprocess.run(server._pinned_argv(), capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str([cpu])
    unpinned = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert unpinned.stdout.strip() == str(sorted(os.sched_getaffinity(0)))


def test_scaling_run_on_a_tiny_model(tiny_repo, tmp_path):
    out = tmp_path / "scaling"
    argv = ["bench", "--model-repo", str(tiny_repo), "--model", "tiny-embed", "--out", str(out), "--quick",
            "--cores", "1"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "scaling.json").read_text())  # strict JSON
    (level,) = result["levels"]
    assert level["cores"] == 1 and len(level["cpus"]) == 1
    assert set(level["inprocess"]) == set(level["servers"]) == {"1x1"}
    server = level["servers"]["1x1"]
    assert server["exit_code"] == 0  # drained and exited on SIGTERM
    for kind in ("bulk", "single"):
        phase = server[kind]
        assert phase["errors"] == {} and phase["inputs"] > 0 and phase["inputs_per_s"] > 0, kind
        assert phase["seconds"] >= 4.0 * 0.9, kind  # ran into its time limit: the texts are repeated enough
    (row,) = result["summary"]
    assert row["server_bulk_best_efficiency"] == 1.0  # the fewest cores are their own reference
    assert math.isclose(
        row["single_vs_bulk"], server["single"]["inputs_per_s"] / server["bulk"]["inputs_per_s"], rel_tol=1e-9
    )
    assert result["settings"]["kx1_shared_session"] is True  # the servers' CPU default, and the ceiling's
    table = (out / "scaling.md").read_text()
    assert "| cores | in-process | server bulk |" in table and "one shared session" in table
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_more_cores_than_allowed_is_refused_before_anything_runs(tiny_repo, tmp_path, capsys):
    too_many = len(os.sched_getaffinity(0)) + 1
    argv = ["bench", "--model-repo", str(tiny_repo), "--out", str(tmp_path), "--cores", str(too_many)]
    assert main(argv) == 1
    assert f"--cores [{too_many}]" in capsys.readouterr().err
