"""Start-time checks: settings (env + flags, bad values named), the repository (manifest, sha256, missing
files), and ONNX Runtime sessions (provider reported truthfully, I/O binding equal to a plain run)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import onnxruntime as ort
import pytest

from bertserve.service.engine.repository import discover
from bertserve.service.engine.runtime import GraphSession
from bertserve.service.engine.tokenization import ModelTokenizer
from bertserve.service.errors import StartupError
from bertserve.service.settings import SettingsError, load_settings


def test_settings_from_environment_with_flags_on_top(monkeypatch):
    monkeypatch.setenv("BERTSERVE_MAX_BATCH_SIZE", "7")
    monkeypatch.setenv("BERTSERVE_MODELS", "tiny-embed, tiny-mlm:1")
    monkeypatch.setenv("BERTSERVE_LOG_LEVEL", "debug")
    settings = load_settings(port="0", max_queue_delay_ms=None)
    assert settings.max_batch_size == 7 and settings.port == 0 and settings.log_level == "DEBUG"
    assert settings.model_specs() == [("tiny-embed", None), ("tiny-mlm", 1)]
    assert load_settings(max_batch_size="9").max_batch_size == 9


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("PORT", "70000", "setting port (BERTSERVE_PORT)"),
        ("PRECISION", "fp64", "setting precision"),
        ("MAX_QUEUE_INPUTS", "0", "setting max_queue_inputs"),
        ("MAX_QUEUE_DELAY_MS", "soon", "setting max_queue_delay_ms"),
        ("MODELS", "../etc/passwd", "setting models"),
        ("TLS_CERT", "missing-cert.pem", "tls_cert and tls_key"),
        ("GRACE_PERIOD_S", "-1", "setting grace_period_s"),
        ("HTTP_MAX_BODY_BYTES_IN_FLIGHT", "2048", "must be at least max_message_bytes 8388608"),
    ],
)
def test_bad_setting_is_named(monkeypatch, name, value, needle):
    monkeypatch.setenv(f"BERTSERVE_{name}", value)
    with pytest.raises(SettingsError) as error:
        load_settings()
    assert needle in str(error.value)


@pytest.fixture
def repo_copy(tiny_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo / "tiny-mlm", repo / "tiny-mlm")
    return repo


def test_repository_loads_and_checks(repo_copy):
    (files,) = discover(repo_copy, [], "int8")
    assert files.name == "tiny-mlm" and files.encoder_key == "encoder_int8"
    with pytest.raises(StartupError, match="no model named nope"):
        discover(repo_copy, [("nope", None)], "fp32")
    with pytest.raises(StartupError, match="no version 3"):
        discover(repo_copy, [("tiny-mlm", 3)], "fp32")


def _break(version_dir, how):
    manifest_path = version_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    if how == "missing graph":
        (version_dir / manifest["graphs"]["mlm_head"]["file"]).unlink()
    elif how == "sha256":
        with open(version_dir / manifest["graphs"]["encoder"]["file"], "ab") as f:
            f.write(b"\0")
    elif how == "schema":
        manifest["schema_version"] = 99
        manifest_path.write_text(json.dumps(manifest))
    elif how == "no manifest":
        manifest_path.unlink()
    elif how == "graph not listed":
        del manifest["graphs"]["mlm_head"]
        manifest_path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("how", "needle"),
    [
        ("missing graph", "graph mlm_head listed in the manifest is missing"),
        ("sha256", "does not match the manifest"),
        ("schema", "invalid manifest at schema_version"),
        ("no manifest", "manifest.json: missing"),
        ("graph not listed", "needs graph 'mlm_head'"),
    ],
)
def test_broken_repository_is_refused(repo_copy, how, needle):
    _break(repo_copy / "tiny-mlm" / "1", how)
    with pytest.raises(StartupError) as error:
        discover(repo_copy, [], "fp32")
    assert needle in str(error.value)


def test_unreadable_tokenizer_is_refused(repo_copy):
    (files,) = discover(repo_copy, [], "fp32")
    files.tokenizer_path.write_text("{not json")
    with pytest.raises(StartupError, match="cannot read the tokenizer"):
        ModelTokenizer(files.tokenizer_path, files.manifest.tokenizer, files.manifest.max_length)


def test_session_reports_its_real_provider_and_io_binding_matches(repo_copy):
    (files,) = discover(repo_copy, [], "fp32")
    path = files.graph_path("encoder")
    plain = GraphSession(path, "auto", 1, 1, io_binding=False)
    bound = GraphSession(path, "auto", 1, 1, io_binding=True)
    assert plain.provider in plain.session.get_providers()  # the truth, not get_available_providers()
    ids = np.array([[2, 40, 41, 3, 0], [2, 42, 43, 44, 3]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64), "token_type_ids": 0 * ids}
    names = ["last_hidden_state", "sentence_embedding"]
    a, b = plain.run(feeds, names), bound.run(feeds, names)
    for name in names:
        assert np.array_equal(a[name], b[name])
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert plain.provider == "CPUExecutionProvider"
        with pytest.raises(StartupError, match="provider cuda was asked for"):
            GraphSession(path, "cuda", 1, 1)


@pytest.mark.parametrize(
    ("available", "setting", "cuda_asked"),
    [
        (["CUDAExecutionProvider", "CPUExecutionProvider"], "auto", True),
        (["CUDAExecutionProvider", "CPUExecutionProvider"], "cuda", True),
        (["CUDAExecutionProvider", "CPUExecutionProvider"], "cpu", False),
        (["CPUExecutionProvider"], "auto", False),
    ],
)
def test_cuda_sessions_leave_out_cudnn_flash_attention(monkeypatch, available, setting, cuda_asked):
    """cuDNN's flash attention builds a graph per new (batch, length) shape (~80 ms each on an H100):
    a CUDA session asks for every attention kernel but that one (bit 8 of sdpa_kernel)."""
    from bertserve.service.engine import runtime

    monkeypatch.setattr(ort, "get_available_providers", lambda: available)
    providers = runtime.providers_for(setting)
    assert providers[-1] == "CPUExecutionProvider"
    if not cuda_asked:
        assert providers == ["CPUExecutionProvider"]
        return
    name, options = providers[0]
    assert name == "CUDAExecutionProvider"
    mask = int(options["sdpa_kernel"])
    assert mask & 8 == 0  # no cuDNN flash attention
    assert mask & 16 and mask & 1  # the unfused kernel (always there) and flash attention stay allowed


def test_server_processes_tokenize_without_the_tokenizers_thread_pool(monkeypatch):
    """Each server process turns off the tokenizers library's own threads (one pool per front, each the
    size of the machine) unless the user set TOKENIZERS_PARALLELISM."""
    from bertserve.service.supervisor.serving import configure_process

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    configure_process(load_settings())
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    configure_process(load_settings())
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
