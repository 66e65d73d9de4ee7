"""Faults. A broken model repository stops `bertserve serve` before it ever reports SERVING: a clear message
naming the file, exit code 1. An ONNX Runtime failure in one batch of a live server fails exactly the calls
in that batch with INTERNAL and a message; every other call is answered and the server keeps serving.

The runtime failure is a real one, made with data only: a copy of tiny-embed whose tokenizer knows one more
word ("boom", id 777) than the model's embedding table has rows (0..776), so any batch holding it makes
ONNX Runtime's EmbedLayerNormalization fail with "input index out of range". No production hook is added.
"""

from __future__ import annotations

import json
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from bertserve.client import Client
from bertserve.repository import sha256_file
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.server import ServerProcess, ServerThread, metric, scrape

BAD_WORD, BAD_ID = "boom", 777  # the tiny models' embedding tables have 777 rows


def _manifest(version_dir: Path) -> dict:
    return json.loads((version_dir / "manifest.json").read_text())


def _write_manifest(version_dir: Path, manifest: dict) -> None:
    (version_dir / "manifest.json").write_text(json.dumps(manifest))


def break_repository(version_dir: Path, fault: str) -> None:
    manifest = _manifest(version_dir)
    encoder = version_dir / manifest["graphs"]["encoder"]["file"]
    tokenizer = version_dir / manifest["tokenizer"]["file"]
    if fault == "missing graph":
        encoder.unlink()
    elif fault == "sha256 mismatch":
        with open(encoder, "ab") as f:
            f.write(b"\0")
    elif fault == "wrong schema version":
        manifest["schema_version"] = 99
        _write_manifest(version_dir, manifest)
    elif fault == "unreadable tokenizer":  # not JSON, with the manifest's sha256 updated to match
        tokenizer.write_text('{"version": "1.0", "model": ')
        manifest["tokenizer"]["sha256"] = sha256_file(tokenizer)
        _write_manifest(version_dir, manifest)
    elif fault == "graph ONNX Runtime cannot load":  # garbage with a matching sha256
        encoder.write_bytes(b"not an onnx graph" * 10)
        manifest["graphs"]["encoder"]["sha256"] = sha256_file(encoder)
        manifest["graphs"]["encoder"]["size_bytes"] = encoder.stat().st_size
        _write_manifest(version_dir, manifest)
    else:
        raise ValueError(fault)


FAULTS = {
    "missing graph": ("encoder.onnx", "graph encoder listed in the manifest is missing"),
    "sha256 mismatch": ("encoder.onnx", "does not match the manifest"),
    "wrong schema version": ("manifest.json", "invalid manifest at schema_version"),
    "unreadable tokenizer": ("tokenizer.json", "cannot read the tokenizer"),
    "graph ONNX Runtime cannot load": ("encoder.onnx", "ONNX Runtime cannot load it"),
}


def test_a_broken_repository_refuses_to_start(tiny_repo, tmp_path):
    """All faults at once, each in its own repository and server process (they start in parallel)."""
    servers = {}
    for fault in FAULTS:
        repo = tmp_path / fault.replace(" ", "-")
        shutil.copytree(tiny_repo / "tiny-embed", repo / "tiny-embed")
        break_repository(repo / "tiny-embed" / "1", fault)
        servers[fault] = ServerProcess("--model-repo", str(repo))
    with ThreadPoolExecutor(len(servers)) as pool:
        codes = dict(
            zip(servers, pool.map(lambda s: s.run_to_exit(timeout=120), servers.values()), strict=True)
        )
    for fault, (file_name, needle) in FAULTS.items():
        output = servers[fault].output
        assert codes[fault] == 1, (fault, output)
        (error_line,) = [line for line in output.splitlines() if "cannot start" in line]
        assert file_name in error_line and needle in error_line, (fault, error_line)
        assert "Traceback" not in output, (fault, output)
        assert "ready in" not in output and "serving bertserve" not in output, (fault, output)


@pytest.fixture(scope="module")
def failing_repo(tiny_repo, tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("boom-repo")
    shutil.copytree(tiny_repo / "tiny-embed", repo / "tiny-embed")
    version_dir = repo / "tiny-embed" / "1"
    manifest = _manifest(version_dir)
    tokenizer_path = version_dir / manifest["tokenizer"]["file"]
    tokenizer = json.loads(tokenizer_path.read_text())
    assert max(tokenizer["model"]["vocab"].values()) < BAD_ID == manifest["dimensions"]["vocab_size"]
    tokenizer["model"]["vocab"][BAD_WORD] = BAD_ID
    tokenizer_path.write_text(json.dumps(tokenizer))
    manifest["tokenizer"]["sha256"] = sha256_file(tokenizer_path)
    _write_manifest(version_dir, manifest)
    return repo


def test_an_onnx_runtime_failure_fails_only_the_calls_in_that_batch(failing_repo):
    with ServerThread(model_repo=failing_repo, max_batch_size=4) as server:
        model = server.server.models[0]
        batches: list[tuple[list[tuple[int, ...]], bool]] = []  # (each input's ids, the batch failed)
        real_compute = model.batcher.runs.compute

        def recording(batch):  # watches batch composition; the failure itself is ONNX Runtime's
            ids = [tuple(item.ids.tolist()) for item in batch]
            try:
                values = real_compute(batch)
            except Exception:
                batches.append((ids, True))
                raise
            batches.append((ids, False))
            return values

        model.batcher.runs.compute = recording
        texts = [f"the cat word{k}" for k in range(40)] + [f"the {BAD_WORD} word{k}" for k in range(40, 46)]
        random.Random(5).shuffle(texts)
        with Client(server.address, timeout=30) as client:
            calls = [client.stub.Embed.future(pb.EmbedRequest(inputs=[t])) for t in texts]
            outcomes = {}
            for text, call in zip(texts, calls, strict=True):
                try:
                    call.result()
                    outcomes[text] = ("OK", "")
                except grpc.RpcError as error:
                    outcomes[text] = (error.code().name, error.details())
            # Each call's text is [CLS] the cat|boom wordK [SEP]: wordK (position 3) names the call.
            failed_words = {ids[3] for members, failed in batches if failed for ids in members}
            assert {ids[2] for members, failed in batches if failed for ids in members} >= {BAD_ID}
            for text, (code, details) in outcomes.items():
                word_id = model.tokenizer.token_to_id(text.rsplit(" ", 1)[1])
                if BAD_WORD in text:
                    assert word_id in failed_words, text  # a bad input always fails its batch
                if word_id in failed_words:
                    assert code == "INTERNAL", (text, code, details)
                    assert "model tiny-embed: inference failed" in details and "ONNXRuntimeError" in details
                else:
                    assert code == "OK", (text, code, details)
            assert any(code == "OK" for code, _ in outcomes.values())
            # The server keeps serving: health, a normal call, and the failures counted as INTERNAL.
            assert client.health() == "SERVING"
            assert len(client.embed(["the cat sat"]).vectors) == 1
            failed_calls = sum(code == "INTERNAL" for code, _ in outcomes.values())
            assert (
                metric(scrape(server.metrics_url), "bertserve_requests_total", code="INTERNAL")
                == failed_calls
            )


# --- repository clutter and half-written versions (service/engine/repository.py) -------------------------------


def _cluttered_copy(tiny_repo, repo: Path) -> Path:
    """tiny-embed version 1 complete; version 2 half-written (no manifest, as a crashed copy leaves it);
    lost+found, a stray file, and a staging directory of a killed export."""
    shutil.copytree(tiny_repo / "tiny-embed", repo / "tiny-embed")
    shutil.copytree(repo / "tiny-embed" / "1", repo / "tiny-embed" / "2")
    (repo / "tiny-embed" / "2" / "manifest.json").unlink()
    (repo / "lost+found").mkdir()
    (repo / "notes.txt").write_text("not a model")
    (repo / "tiny-embed" / ".staging-3-999999-x1").mkdir()
    return repo


def test_a_cluttered_repository_serves_the_newest_complete_version(tiny_repo, tmp_path):
    repo = _cluttered_copy(tiny_repo, tmp_path / "repo")
    server = ServerProcess("--model-repo", str(repo)).start()
    try:
        with Client(server.address, timeout=30) as client:
            client.wait_until_serving()
            (model,) = client.info().models
            assert (model.name, model.version) == ("tiny-embed", 1)
            assert len(client.stub.Embed(pb.EmbedRequest(inputs=["the cat sat"])).embeddings) == 1
    finally:
        server.terminate()
    warnings = [line for line in server.output.splitlines() if "WARNING" in line]
    for needle in ("lost+found", "notes.txt", ".staging-3-999999-x1", "tiny-embed/2/manifest.json: missing"):
        assert sum(needle in line for line in warnings) == 1, (needle, warnings)


def test_a_broken_version_named_explicitly_refuses_to_start(tiny_repo, tmp_path):
    repo = _cluttered_copy(tiny_repo, tmp_path / "repo")
    server = ServerProcess("--model-repo", str(repo), "--model", "tiny-embed:2")
    assert server.run_to_exit(timeout=120) == 1
    (line,) = [line for line in server.output.splitlines() if "cannot start" in line]
    assert "tiny-embed/2/manifest.json: missing" in line and "Traceback" not in server.output


def test_a_head_whose_encoder_changed_refuses_to_start(shared_repo, tmp_path):
    repo = shutil.copytree(shared_repo, tmp_path / "repo")
    encoder_manifest = repo / "tiny-encoder" / "1" / "manifest.json"
    manifest = json.loads(encoder_manifest.read_text())
    manifest["export"]["source"] = "re-exported"
    encoder_manifest.write_text(json.dumps(manifest))
    server = ServerProcess("--model-repo", str(repo))
    assert server.run_to_exit(timeout=120) == 1
    (line,) = [line for line in server.output.splitlines() if "cannot start" in line]
    assert f"{encoder_manifest}: sha256" in line and "encoder reference" in line, line
