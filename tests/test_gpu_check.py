"""`make gpu-check` (scripts/gpu-check.sh and bench/gpu_check.py) on a machine without a GPU: the command
line, the one-line refusal where no GPU is usable (before anything is installed), and the summary of the
GPU goals, read from the committed H100 run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bertserve.bench import gpu_check, server_metrics

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
H100_BENCH = ROOT / "docs" / "performance" / "gpu-h100" / "bench.json"
# What the script runs before its GPU check: with only these on PATH, a missing nvidia-smi is the only gap.
TOOLS = ("bash", "timeout", "dirname", "tr", "grep", "head", "tail", "sleep", "sh")
RUN_TIMEOUT_S = 60  # a bound on each run of the script here, never a measurement


def _path_without_nvidia_smi(tmp_path: Path, nvidia_smi: str | None = None) -> str:
    """A PATH of links to TOOLS alone, plus a stand-in nvidia-smi whose script is `nvidia_smi`."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in TOOLS:
        found = shutil.which(name)
        assert found, f"{name} is not installed"
        (tools / name).symlink_to(found)
    if nvidia_smi is not None:
        stand_in = tools / "nvidia-smi"
        stand_in.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        stand_in.chmod(0o755)
    return str(tools)


def _run(*args: str, path: str | None = None, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    if path is not None:
        environment["PATH"] = path
    environment.update(env)
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=environment, cwd=ROOT
    )


def _one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_without_nvidia_smi_it_stops_with_one_line_before_installing_anything(tmp_path):
    result = _run(path=_path_without_nvidia_smi(tmp_path))
    assert result.returncode == gpu_check.NO_GPU
    assert result.stdout == ""
    assert _one_line(result) == "gpu-check: no usable GPU: nvidia-smi is not on PATH (no NVIDIA driver)"


def test_a_failing_nvidia_smi_is_refused_with_its_reason(tmp_path):
    driver = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    result = _run(path=_path_without_nvidia_smi(tmp_path, f'echo "{driver}" >&2; exit 9'))
    assert result.returncode == gpu_check.NO_GPU
    assert _one_line(result) == f"gpu-check: no usable GPU: nvidia-smi failed: {driver}"


def test_a_hung_nvidia_smi_is_cut_at_the_phase_budget(tmp_path):
    result = _run(path=_path_without_nvidia_smi(tmp_path, "sleep 50"), GPU_CHECK_GPU_S="1")
    assert result.returncode == gpu_check.NO_GPU
    assert _one_line(result) == "gpu-check: no usable GPU: the gpu check did not answer within 1 s"


def test_a_cpu_build_of_onnxruntime_is_refused_at_the_sanity_step(tmp_path):
    """nvidia-smi answers (a stand-in), but this environment's onnxruntime is the CPU build: with
    --no-install the script installs nothing and stops at the sanity step."""
    import onnxruntime

    assert onnxruntime.get_device() == "CPU", "the test environment has onnxruntime's CPU build (pyproject)"
    path = _path_without_nvidia_smi(tmp_path, 'echo "NVIDIA H100 80GB HBM3, 1980"')
    out = tmp_path / "results"
    result = _run(
        "--python", sys.executable, "--no-install", "--out", str(out), path=f"{path}:{os.environ['PATH']}"
    )
    assert result.returncode == gpu_check.NO_GPU, result.stdout + result.stderr
    assert "gpu-check: [sanity]" in result.stdout
    line = _one_line(result)
    assert line.startswith("gpu-check: no usable GPU: onnxruntime "), line
    assert "is a CPU build (get_device() says CPU)" in line
    assert not out.exists()


def _stub_wheel(folder: Path, record: Path | None = None) -> None:
    """A wheel of a stand-in `onnxruntime` (a CPU build by its own account, version 0.0.1); `record`: its
    get_device() writes the environment it runs in there, as JSON."""
    info = "onnxruntime-0.0.1.dist-info"
    records = (
        f"    import json, os\n    open({str(record)!r}, 'w').write(json.dumps(dict(os.environ)))\n"
        if record
        else ""
    )
    with zipfile.ZipFile(folder / "onnxruntime-0.0.1-py3-none-any.whl", "w") as wheel:
        wheel.writestr(
            "onnxruntime/__init__.py",
            f'__version__ = "0.0.1"\n\ndef get_device():\n{records}    return "CPU"\n',
        )
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: onnxruntime\nVersion: 0.0.1\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")


def test_a_bundle_is_installed_from_its_wheels_alone_ahead_of_the_interpreters_packages(tmp_path):
    """--bundle (a machine without a package index): the bundle's wheels go into a folder of their own that
    comes first on the path, so its onnxruntime is the one the sanity step meets."""
    path = _path_without_nvidia_smi(tmp_path, 'echo "NVIDIA H100 80GB HBM3, 1980"')
    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    _stub_wheel(bundle / "wheels")
    result = _run("--bundle", str(bundle), "--python", sys.executable, path=f"{path}:{os.environ['PATH']}")
    assert result.returncode == gpu_check.NO_GPU, result.stdout + result.stderr
    assert "gpu-check: [setup] done" in result.stdout
    line = [line for line in result.stderr.splitlines() if line.startswith("gpu-check:")]
    assert line == ["gpu-check: no usable GPU: onnxruntime 0.0.1 is a CPU build (get_device() says CPU): "
                    "install onnxruntime-gpu in its place"]  # fmt: skip


def test_a_bundles_native_code_and_libraries_are_what_every_step_finds(tmp_path):
    path = _path_without_nvidia_smi(tmp_path, 'echo "NVIDIA H100 80GB HBM3, 1980"')
    bundle, record = tmp_path / "bundle", tmp_path / "environment.json"
    (bundle / "wheels").mkdir(parents=True)
    (bundle / "native" / "lib").mkdir(parents=True)
    _stub_wheel(bundle / "wheels", record)
    result = _run("--bundle", str(bundle), "--python", sys.executable, path=f"{path}:{os.environ['PATH']}")
    assert result.returncode == gpu_check.NO_GPU, result.stdout + result.stderr
    seen = json.loads(record.read_text())  # at the sanity step, as the bench's runs see it after
    assert seen["BERTSERVE_CACHE_DIR"] == str(bundle / "native")
    assert str(bundle / "native" / "lib") in seen["LD_LIBRARY_PATH"].split(":")


def test_gpu_bundle_carries_the_native_code_and_the_libraries_it_loads(tmp_path):
    """With a stand-in pip (no download here), the bundle's native/ holds the transport, the WordPiece and
    both load generators under the names the checkout's sources give them, and gRPC's libraries, not
    glibc's."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "pip").write_text("#!/bin/sh\nexit 0\n")
    (tools / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    for tool in tools.iterdir():
        tool.chmod(0o755)
    repo = tmp_path / "repo"
    (repo / "all-minilm-l6-v2" / "1").mkdir(parents=True)
    (repo / "all-minilm-l6-v2" / "1" / "manifest.json").write_text("{}")
    bundle = tmp_path / "bundle"
    result = subprocess.run(
        [str(ROOT / "scripts" / "gpu-bundle.sh"), str(bundle), "--pip", str(tools / "pip"), "--repo", str(repo)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    from bertserve.bench import native_loadgen
    from bertserve.service.engine import native_wordpiece
    from bertserve.service.grpc.native import transport

    expected = [
        transport.library_file(),
        native_wordpiece.library_file(),
        native_loadgen.cached_binary(),
        native_loadgen.cached_binary(native_loadgen.HTTP_SOURCE),
    ]
    assert sorted(p.name for p in (bundle / "native").glob("bertserve-*")) == sorted(p.name for p in expected)
    libraries = {p.name for p in (bundle / "native" / "lib").iterdir()}
    assert any(name.startswith("libgrpc++.so") for name in libraries), libraries
    assert not any(
        name.startswith(("libc.so", "libstdc++", "libm.so", "libssl", "libz.")) for name in libraries
    )


def test_a_bundle_without_wheels_stops_at_setup_with_one_line(tmp_path):
    path = _path_without_nvidia_smi(tmp_path, 'echo "NVIDIA H100 80GB HBM3, 1980"')
    (tmp_path / "bundle").mkdir()
    result = _run("--bundle", str(tmp_path / "bundle"), path=f"{path}:{os.environ['PATH']}")
    assert result.returncode == 1
    assert _one_line(result) == f"gpu-check: no wheels in {tmp_path / 'bundle'}/wheels (make gpu-bundle)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "name the bundle's DIR (see --help)"),
        (["out", "--python-version", "twelve"], "--python-version twelve: give X.Y, e.g. 3.12"),
        (["out", "--pip", "/nowhere/pip"], "no /nowhere/pip: run make setup first (or pass --pip)"),
        (
            ["out", "--repo", "/nowhere"],
            "no all-minilm-l6-v2 in /nowhere: run make export-default first (or pass --repo)",
        ),
    ],
)
def test_gpu_bundle_refuses_a_wrong_command_line_with_one_line(args, message, tmp_path):
    result = subprocess.run(
        [str(ROOT / "scripts" / "gpu-bundle.sh"), *args],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1 and _one_line(result) == f"gpu-bundle: {message}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown argument --bogus (see --help)"),
        (["--bundle", "/nowhere"], "--bundle /nowhere: no such folder"),
        (
            ["--setting", "max_batch_size"],
            "--setting max_batch_size: give NAME=VALUE (a setting's name, no spaces)",
        ),
        (["--setting", "a b=1"], "--setting a b=1: give NAME=VALUE (a setting's name, no spaces)"),
        (["--workers"], "--workers needs a value (see --help)"),
        (
            ["--workers", "0"],
            "--workers: 0 is neither an integer >= 1, auto, nor native-N (N an integer or auto)",
        ),
        (
            ["--workers", "1,two"],
            "--workers: two is neither an integer >= 1, auto, nor native-N (N an integer or auto)",
        ),
        (
            ["--workers", "native-0"],
            "--workers: native-0 is neither an integer >= 1, auto, nor native-N (N an integer or auto)",
        ),
        (
            ["--workers", "native-auto:max_batch_size"],
            "--workers: native-auto:max_batch_size: give a run's own settings as :NAME=VALUE",
        ),
        (
            ["--workers", "auto,bogus:max_batch_size=8"],
            "--workers: bogus is neither an integer >= 1, auto, nor native-N (N an integer or auto)",
        ),
    ],
)
def test_a_wrong_command_line_exits_2_with_one_line(args, message, tmp_path):
    result = _run(*args, path=_path_without_nvidia_smi(tmp_path))
    assert result.returncode == 2
    assert _one_line(result) == f"gpu-check: {message}"


def test_help_names_every_option():
    result = _run("--help")
    assert result.returncode == 0
    for option in (
        "--workers",
        "--out",
        "--repo",
        "--python",
        "--no-install",
        "--bundle",
        "GPU_CHECK_BENCH_S",
    ):
        assert option in result.stdout


def test_make_runs_the_script():
    # --no-print-directory: under `make test` the outer make's MAKELEVEL makes make print its directory
    command = ["make", "--no-print-directory", "-n", "gpu-check"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert result.returncode == 0 and result.stdout.split() == ["scripts/gpu-check.sh"], result.stdout


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        ("NVIDIA H100 80GB HBM3", "gpu-h100"),
        ("NVIDIA H100 PCIe", "gpu-h100-pcie"),
        ("NVIDIA H200", "gpu-h200"),
        ("NVIDIA GeForce RTX 4090", "gpu-geforce-rtx-4090"),
    ],
)
def test_device_folder_names(name, folder):
    assert gpu_check.device_dir(name) == folder


def test_summary_shows_the_servers_cpu_and_its_busiest_threads(tmp_path):
    bench = json.loads(H100_BENCH.read_text())
    at_1 = next(p for p in bench["targets"]["server-fp32"]["closed"] if p["concurrency"] == 1)
    at_1["busiest_threads"] = [
        {"process": "bs-engine", "thread": "bs-compute", "threads": 1, "cores": 0.92},
        {"process": "bs-front-0", "thread": "bs-front-0", "threads": 3, "cores": 0.04},
    ]
    (tmp_path / "workers-native-auto").mkdir()
    (tmp_path / "workers-native-auto" / "bench.json").write_text(json.dumps(bench))
    figures = gpu_check.summarize(tmp_path)["figures"]["native-auto"]
    assert at_1["server_cpu_cores"] is not None
    assert figures["server-fp32 server CPU cores at c=1"] == at_1["server_cpu_cores"]
    table = (tmp_path / "gpu-check.md").read_text()
    assert (
        "- workers native-auto, server-fp32 at c=1: bs-engine/bs-compute (1) 0.92, "
        "bs-front-0/bs-front-0 (3) 0.04 cores"
    ) in table
    assert "at c=256: " not in table  # that phase has no thread figures (a bench before Round 16)
    at_256 = next(p for p in bench["targets"]["server-fp32"]["closed"] if p["concurrency"] == 256)
    at_256["server"].update(inference_ms_mean=6.6, encoder_run_ms_mean=2.9, batch_cycle_ms=7.1)
    (tmp_path / "workers-native-auto" / "bench.json").write_text(json.dumps(bench))
    gpu_check.summarize(tmp_path)
    table = (tmp_path / "gpu-check.md").read_text()
    for what, value in (("compute", "6.600"), ("ONNX Runtime's run", "2.900"), ("wall time", "7.100")):
        assert f"| server-fp32 {what} ms per batch (c=256) | – | {value} |" in table
    assert "| server-fp32 GPU memory MiB (its processes, after its phases) | – | – |" in table  # not measured
    bench["targets"]["server-fp32"]["gpu_memory_mib"] = 2871.0
    (tmp_path / "workers-native-auto" / "bench.json").write_text(json.dumps(bench))
    gpu_check.summarize(tmp_path)
    table = (tmp_path / "gpu-check.md").read_text()
    assert "| server-fp32 GPU memory MiB (its processes, after its phases) | – | 2,871 |" in table
    assert "| server-fp32 batch cost line, ms per batch (batch_cut cost) | – | – |" in table  # cut by padding
    samples = {
        ("bertserve_batch_cost_seconds", (("model", "m"), ("term", "fixed"))): 4.5e-4,
        ("bertserve_batch_cost_seconds", (("model", "m"), ("term", "token"))): 5e-7,
        ("bertserve_queue_depth", (("model", "m"),)): 3.0,
    }
    bench["targets"]["server-fp32"]["batch_cost"] = server_metrics.batch_cost(samples)
    assert server_metrics.batch_cost({}) is None
    (tmp_path / "workers-native-auto" / "bench.json").write_text(json.dumps(bench))
    gpu_check.summarize(tmp_path)
    table = (tmp_path / "gpu-check.md").read_text()
    assert "| server-fp32 batch cost line, ms per batch (batch_cut cost) | – | 0.450 |" in table
    assert "| server-fp32 batch cost line, us per padded token (batch_cut cost) | – | 0.500 |" in table


def test_summary_puts_the_goals_of_each_run_side_by_side(tmp_path):
    bench = json.loads(H100_BENCH.read_text())
    for workers in ("1", "auto"):
        (tmp_path / f"workers-{workers}").mkdir()
        shutil.copy(H100_BENCH, tmp_path / f"workers-{workers}" / "bench.json")
    summary = gpu_check.summarize(tmp_path)
    assert f"; {bench['created_at']}. Each run's own report" in (tmp_path / "gpu-check.md").read_text()
    later = {**bench, "created_at": "2030-01-02T03:04:05+00:00"}  # a run of a later check beside it
    (tmp_path / "workers-auto" / "bench.json").write_text(json.dumps(later))
    gpu_check.summarize(tmp_path)
    dates = f"runs from {bench['created_at']} to 2030-01-02T03:04:05+00:00."
    assert dates in (tmp_path / "gpu-check.md").read_text()
    shutil.copy(H100_BENCH, tmp_path / "workers-auto" / "bench.json")
    summary = gpu_check.summarize(tmp_path)
    assert list(summary["figures"]) == ["1", "auto"]
    figures = summary["figures"]["auto"]
    fp16_at_256 = next(p for p in bench["targets"]["server-fp16"]["closed"] if p["concurrency"] == 256)
    ceiling = bench["inprocess"]["fp16"]["mixed"]["inputs_per_s"]
    single = "server-fp16, single-input callers at c=256 / fp16 in-process ceiling"
    assert figures[single] == pytest.approx(fp16_at_256["inputs_per_s"] / ceiling)
    bulk = (
        bench["per_call_profile"]["bulk"]["inputs_per_s"]
        / bench["inprocess"]["fp32"]["mixed"]["inputs_per_s"]
    )
    assert figures["server-fp32, 32-input requests / fp32 in-process ceiling"] == pytest.approx(bulk)
    assert figures["server-fp16 / server-fp32 (saturation)"] == bench["ratios"]["fp16_vs_server_fp32"]
    assert figures["HTTP /bertserve/v1/embed / gRPC, single input (saturation)"] is None  # not on the H100
    table = (tmp_path / "gpu-check.md").read_text()
    assert "| figure | goal | workers 1 | workers auto |" in table
    assert (
        f"| {single} | >= 0.5 | {figures[single]:.3f} (not met) | {figures[single]:.3f} (not met) |" in table
    )
    assert json.loads((tmp_path / "gpu-check.json").read_text())["gpu"] == bench["machine"]["gpu"]["gpu"]


def test_each_setting_reaches_every_bench_run(tmp_path):
    """--setting NAME=VALUE: the bench phase passes it on as --server-setting (a stand-in interpreter
    records what it is asked to run)."""
    calls = tmp_path / "calls"
    stand_in = tmp_path / "python"
    stand_in.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    stand_in.chmod(0o755)
    env = {
        "PYTHON_BIN": str(stand_in),
        "REPO": str(tmp_path / "repo"),
        "SCRATCH": str(tmp_path / "scratch"),
        "OUT": str(tmp_path / "out"),
        "GPU_CHECK_SETTINGS": "max_batch_size=256 max_batch_tokens=65536",
    }
    result = _run("__phase", "bench", "2", **env)
    assert result.returncode == 1  # the stand-in wrote no bench.json to copy
    (bench,) = [line.split() for line in calls.read_text().splitlines() if " bench --provider" in line]
    pairs = list(zip(bench, bench[1:], strict=False))
    for setting in ("max_batch_size=256", "max_batch_tokens=65536", "workers=2"):
        assert ("--server-setting", setting) in pairs
    # a run's own settings (WORKERS:NAME=VALUE...) come after the common ones, so they win; a folder of its own
    calls.write_text("")
    result = _run(
        "__phase", "bench", "native-auto:max_batch_size=128:batch_shapes=exact:loadgen_threads=1", **env
    )
    (bench,) = [line.split() for line in calls.read_text().splitlines() if " bench --provider" in line]
    settings = [b for a, b in zip(bench, bench[1:], strict=False) if a == "--server-setting"]
    assert settings == ["max_batch_size=256", "max_batch_tokens=65536", "max_batch_size=128",
                        "batch_shapes=exact", "workers=auto"]  # fmt: skip
    assert bench[bench.index("--loadgen-threads") + 1] == "1"  # the client's, not the server's
    assert bench[bench.index("--out") + 1] == str(
        tmp_path / "scratch" / "workers-native-auto-max_batch_size-128-batch_shapes-exact-loadgen_threads-1"
    )
    assert (
        "--front" in bench
        and "cannot copy the results of workers-native-auto-max_batch_size-128" in result.stderr
    )


def test_the_cpu_phase_runs_server_fp32_on_every_core_and_the_summary_reads_it(tmp_path):
    calls = tmp_path / "calls"
    stand_in = tmp_path / "python"
    stand_in.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncase "$*" in *usable_cpus*) echo 16 ;; esac\n')
    stand_in.chmod(0o755)
    env = {"PYTHON_BIN": str(stand_in), "REPO": str(tmp_path / "repo"), "SCRATCH": str(tmp_path / "scratch"),
           "OUT": str(tmp_path / "out")}  # fmt: skip
    result = _run("__phase", "cpu", **env)
    assert result.returncode == 1 and "cannot copy the results of cpu" in result.stderr
    (bench,) = [line.split() for line in calls.read_text().splitlines() if " bench --provider" in line]
    assert (
        bench[bench.index("--provider") + 1] == "cpu" and bench[bench.index("--targets") + 1] == "server-fp32"
    )
    settings = {b for a, b in zip(bench, bench[1:], strict=False) if a == "--server-setting"}
    assert settings == {"workers=auto", "grpc_transport=native", "instances=8"}
    # the summary: the many-core goal under the GPU runs' table
    run = tmp_path / "out" / "workers-auto"
    run.mkdir(parents=True)
    shutil.copy(H100_BENCH, run / "bench.json")
    cpu = json.loads(H100_BENCH.read_text())
    cpu["ratios"]["single_vs_bulk"] = 0.93
    cpu["settings"]["server_settings"] = {"workers": "auto", "instances": "8"}
    (tmp_path / "out" / "cpu").mkdir(exist_ok=True)  # save_run made it before failing to copy
    (tmp_path / "out" / "cpu" / "bench.json").write_text(json.dumps(cpu))
    summary = gpu_check.summarize(tmp_path / "out")
    assert summary["cpu"]["single_vs_bulk"] == 0.93 and list(summary["figures"]) == ["auto"]
    table = (tmp_path / "out" / "gpu-check.md").read_text()
    assert (
        "16 logical cores, workers auto, instances 8): single-input callers / 32-input requests 0.930 (met)"
        in table
    )
