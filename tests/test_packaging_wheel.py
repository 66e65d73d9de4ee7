"""The image's commands, run for real from the wheel in a clean venv (no Docker engine, no stand-in).

The wheel is built as the Dockerfile's wheel stage builds it (tests/helpers/wheel.py) and installed alone
into a fresh venv that cannot see the source tree; its dependencies come from this environment. Then:
- the exporter stage's `bertserve` commands run from it by `sh -e`, /models moved into a temporary folder
  (`export --default` on a tiny checkpoint with the stage's flags, `export-default-heads` as written onto
  the session's MiniLM export; all as written in the slow test, run by `make soak`): they write the three default models;
- the cpu stage's ENTRYPOINT + CMD (`bertserve serve`), configured by the stage's ENV, serves that
  repository, and each default model answers a gRPC call;
- SIGTERM ends it with exit code 0.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess

import grpc
import pytest

from bertserve.v1 import inference_pb2, inference_pb2_grpc
from tests.deploy_support import ROOT, LineReader, parse_dockerfile
from tests.helpers.wheel import build_wheel, clean_env, wheel_venv

pytestmark = pytest.mark.timeout(900)

READY = r"serving bertserve\.v1\.Inference on [\d.]+:(\d+), metrics on"


@pytest.fixture(scope="module")
def stages():
    _, parsed = parse_dockerfile(ROOT / "Dockerfile")
    return {stage.name: stage for stage in parsed}


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel-venv")
    return wheel_venv(build_wheel(work), work)


@pytest.fixture(scope="module")
def cwd(tmp_path_factory):
    return tmp_path_factory.mktemp("cwd")  # not the repository root, whose bertserve/ would shadow the wheel


def test_bertserve_is_imported_from_the_wheel_alone(venv, cwd):
    script = (
        "import bertserve, bertserve.export.heads.assemble as a; print(bertserve.__file__); print(a.__file__)"
    )
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script],
        env=clean_env(venv),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for path in result.stdout.split():
        assert path.startswith(str(venv) + "/"), path


def test_without_the_bench_distribution_bertserve_bench_says_which_extra_to_install(venv, cwd):
    result = subprocess.run(
        [str(venv / "bin" / "bertserve"), "bench", "--help"],
        env=clean_env(venv),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "pip install 'bertserve[bench]'" in result.stderr, result.stderr


def _bertserve_commands(stage) -> list[str]:
    """The `bertserve ...` commands of a stage's RUN lines, in order (RUN lines split at `&&`)."""
    commands = [part.strip() for run in stage.all("RUN") for part in run.split("&&")]
    return [command for command in commands if command.startswith("bertserve ")]


def _run_sh(script: str, venv, cwd) -> None:
    result = subprocess.run(
        ["sh", "-e", "-c", script], env=clean_env(venv), cwd=cwd, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _moved(command: str, models) -> str:
    return re.sub(r"(?<![\w/.])/models\b", str(models), command)


@pytest.fixture(scope="module")
def models(request, venv, stages, default_repo, make_tiny_checkpoint, tmp_path_factory, cwd):
    """The exporter stage's `bertserve` commands run from the wheel, /models moved into tmp_path.

    The encoder comes from the session's `default_repo` (`bertserve export --default` from the source
    tree, which other tests make anyway); the stage's `export --default` runs from the wheel with its flags
    on a tiny checkpoint instead of MiniLM (the wheel's export code and those flags, in seconds); every
    other command, `export-default-heads` among them, runs as written. The slow test below runs them all
    as written, MiniLM included (minutes on a small machine).
    """
    commands = _bertserve_commands(stages["exporter"])
    assert any(c.startswith("bertserve export ") for c in commands), "the exporter stage exports no model"
    models = tmp_path_factory.mktemp("image") / "models"
    shutil.copytree(default_repo, models)
    scratch = tmp_path_factory.mktemp("tiny-export")
    for command in commands:
        argv = shlex.split(command)
        if argv[1] == "export" and "--default" in argv:
            argv[argv.index("--default")] = f"--checkpoint={make_tiny_checkpoint('BertModel')}"
            argv[argv.index("--out") + 1] = str(scratch)
            _run_sh(shlex.join(argv), venv, cwd)
            graphs = {path.name for path in scratch.glob("*/1/*.onnx")}
            assert graphs == {
                "encoder.onnx",
                "encoder_int8.onnx",
                "encoder_fp16.onnx",
                "encoder_attentions.onnx",
            }
        else:
            _run_sh(_moved(command, models), venv, cwd)
    return models


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("BERTSERVE_SOAK_SECONDS"), reason="long variant: make soak (BERTSERVE_SOAK_SECONDS)"
)
def test_the_exporter_stage_as_written_writes_every_default_model(venv, stages, tmp_path, cwd):
    from bertserve.export.default_model import DEFAULT_MODEL_NAME
    from bertserve.export.heads.assemble import CLASSIFIER_NAME, FILL_MASK_NAME
    from bertserve.export.heads.reranker import RERANKER_NAME

    models = tmp_path / "models"
    _run_sh(" && ".join(_moved(c, models) for c in _bertserve_commands(stages["exporter"])), venv, cwd)
    written = {path.parent.parent.name for path in models.glob("*/*/manifest.json")}
    assert written == {DEFAULT_MODEL_NAME, CLASSIFIER_NAME, FILL_MASK_NAME, RERANKER_NAME}


def test_the_exporter_stage_writes_every_default_model(models):
    from bertserve.export.default_model import DEFAULT_MODEL_NAME
    from bertserve.export.heads.assemble import CLASSIFIER_NAME, FILL_MASK_NAME
    from bertserve.export.heads.reranker import RERANKER_NAME

    written = {path.parent.parent.name for path in models.glob("*/*/manifest.json")}
    assert written == {DEFAULT_MODEL_NAME, CLASSIFIER_NAME, FILL_MASK_NAME, RERANKER_NAME}


def _stage_env(stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in stage.all("ENV"):
        env.update(re.findall(r"(\w+)=(\S+)", instruction))
    return env


def test_the_cpu_stage_serves_the_exported_models(venv, stages, models, cwd):
    from bertserve.export.default_model import DEFAULT_MODEL_NAME
    from bertserve.export.heads.assemble import CLASSIFIER_NAME, FILL_MASK_NAME
    from bertserve.export.heads.reranker import RERANKER_NAME

    stage = stages["cpu"]
    settings = {k: v for k, v in _stage_env(stage).items() if k.startswith("BERTSERVE_")}
    settings.update(
        BERTSERVE_MODEL_REPO=str(models),
        BERTSERVE_HOST="127.0.0.1",
        BERTSERVE_PORT="0",
        BERTSERVE_METRICS_PORT="0",
        BERTSERVE_HTTP_PORT="0",
        BERTSERVE_GRACE_PERIOD_S="5",
    )
    command = json.loads(stage.all("ENTRYPOINT")[-1]) + json.loads(stage.all("CMD")[-1])
    assert command == ["bertserve", "serve"]
    process = subprocess.Popen(
        command,
        env=clean_env(venv, **settings),
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = LineReader(process.stderr)
    try:
        ready = log.wait_for(READY, 300)
        assert ready, "server did not report serving:\n" + log.text()
        with grpc.insecure_channel(f"127.0.0.1:{ready.group(1)}") as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            embedded = stub.Embed(
                inference_pb2.EmbedRequest(inputs=["a cat sat on the mat"], model=DEFAULT_MODEL_NAME),
                timeout=60,
            )
            assert embedded.dimension == 384 and len(embedded.embeddings[0].values) == 384
            classified = stub.Classify(
                inference_pb2.ClassifyRequest(inputs=["a small dog"], model=CLASSIFIER_NAME), timeout=60
            )
            assert classified.results[0].labels and classified.metadata.model == CLASSIFIER_NAME
            filled = stub.FillMask(
                inference_pb2.FillMaskRequest(inputs=["a dog is a kind of [MASK]."], model=FILL_MASK_NAME),
                timeout=60,
            )
            assert len(filled.results[0].masks[0].candidates) == 5
            reranked = stub.Rerank(
                inference_pb2.RerankRequest(query="a pet that barks", documents=["a wild cat", "a dog"]),
                timeout=60,
            )
            assert reranked.metadata.model == RERANKER_NAME and reranked.method == "cross_encoder+cosine"
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
