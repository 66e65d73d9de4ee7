"""deploy/kubernetes/overlays/own-models: the init container fills the claim, the server reads it.

The overlay is rendered with `kubectl kustomize` (tests/test_deploy_kubernetes.py validates every object
strictly). Its init container's command runs here as written, on the script and the environment the
rendered ConfigMaps carry, with the claim's mount moved into tmp_path: from a tiny random checkpoint it
writes a repository that `bertserve serve` loads and answers from; from a tarball over loopback HTTP it
unpacks one (refusing members outside it); a source already loaded is not fetched again.
"""

from __future__ import annotations

import functools
import http.server
import io
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import grpc
import pytest

from bertserve.v1 import inference_pb2, inference_pb2_grpc
from tests.deploy_support import KUSTOMIZE_DIRS, by_kind, one, render_kustomize
from tests.helpers.server import ServerProcess


@pytest.fixture(scope="module")
def documents() -> list[dict]:
    return render_kustomize(KUSTOMIZE_DIRS["own-models"])


def _pod(documents) -> dict:
    return one(documents, "Deployment")["spec"]["template"]["spec"]


def _config_map(documents, reference: dict) -> dict:
    return one(documents, "ConfigMap", reference["configMapRef"]["name"])["data"]


def test_the_init_container_writes_the_claim_that_the_server_mounts_read_only(documents, monkeypatch):
    from bertserve.service.settings import load_settings

    pod = _pod(documents)
    (server,), (loader,) = pod["containers"], pod["initContainers"]
    settings_ref, source_ref = loader["envFrom"]
    assert settings_ref == server["envFrom"][0]  # the same BERTSERVE_MODEL_REPO
    for key, value in _config_map(documents, settings_ref).items():
        monkeypatch.setenv(key, value)
    model_repo = str(load_settings().model_repo)
    claim = one(documents, "PersistentVolumeClaim")
    (volume,) = [
        v for v in pod["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == "bertserve-models"
    ]
    assert volume["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}
    mounts = {c["name"]: {m["name"]: m for m in c["volumeMounts"]} for c in (server, loader)}
    assert mounts["bertserve"][volume["name"]] == {
        "name": volume["name"],
        "mountPath": model_repo,
        "readOnly": True,
    }
    assert mounts["load-models"][volume["name"]] == {"name": volume["name"], "mountPath": model_repo}
    assert set(claim["spec"]["accessModes"]) & {"ReadWriteMany"}  # every replica's loader and server mount it
    # The loader's script comes from the generated ConfigMap, mounted where its command reads it.
    (script_volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert script_volume["configMap"]["name"] == source_ref["configMapRef"]["name"]
    script_mount = mounts["load-models"][script_volume["name"]]
    assert loader["command"] == ["sh", f"{script_mount['mountPath']}/load-models.sh"]
    assert "load-models.sh" in one(documents, "ConfigMap", script_volume["configMap"]["name"])["data"]
    # Locked down like the server; the images come from the overlay's `images:` stanza.
    assert loader["securityContext"] == server["securityContext"]
    assert server["image"] == "bertserve:0.1.0-cpu" and loader["image"] == "bertserve:0.1.0-export"
    assert by_kind(documents, "Job") == []


def _run_loader(documents, repo: Path, **source: str) -> subprocess.CompletedProcess:
    """The init container's command as written, its script and environment from the rendered ConfigMaps,
    the claim at REPO and `bertserve`/`python` from this environment."""
    (loader,) = _pod(documents)["initContainers"]
    settings_ref, source_ref = loader["envFrom"]
    scripts = repo.parent / "loader"
    scripts.mkdir(exist_ok=True)
    data = _config_map(documents, source_ref)
    (scripts / "load-models.sh").write_text(data["load-models.sh"])
    env = {**os.environ, **{k: v for k, v in data.items() if k.startswith("BERTSERVE_")}}
    env.update(
        _config_map(documents, settings_ref), BERTSERVE_MODEL_REPO=str(repo), HOSTNAME="pod-0", **source
    )
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    command = [arg.replace("/loader/", f"{scripts}/") for arg in loader["command"]]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def test_the_loader_exports_a_checkpoint_into_a_repository_that_bertserve_serves(
    documents, make_tiny_checkpoint, tmp_path
):
    repo = tmp_path / "claim"
    repo.mkdir()
    source = {"BERTSERVE_MODELS_SOURCE": f"checkpoint:{make_tiny_checkpoint('BertModel')}"}
    loaded = _run_loader(documents, repo, **source, BERTSERVE_MODELS_NAME="my-model")
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    assert "added my-model/1" in loaded.stdout
    assert sorted(p.name for p in (repo / "my-model" / "1").glob("*.onnx")) == [
        "encoder.onnx",
        "encoder_int8.onnx",
    ]
    assert [p.name for p in repo.iterdir() if p.name.startswith(".staging")] == []
    server = ServerProcess("--model-repo", str(repo)).start(timeout=180)
    try:
        with grpc.insecure_channel(server.address) as channel:
            reply = inference_pb2_grpc.InferenceStub(channel).Embed(
                inference_pb2.EmbedRequest(inputs=["the cat sat on the mat"], model="my-model"), timeout=60
            )
        assert reply.metadata.model == "my-model" and len(reply.embeddings[0].values) == reply.dimension > 0
    finally:
        assert server.terminate() == 0
    again = _run_loader(documents, repo, **source, BERTSERVE_MODELS_NAME="my-model")
    assert again.returncode == 0 and "already holds" in again.stdout, again.stdout + again.stderr
    assert [p.name for p in (repo / "my-model").iterdir()] == ["1"]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def http_folder(tmp_path):
    """A loopback HTTP server on a folder of its own; yields (folder, base URL)."""
    folder = tmp_path / "www"
    folder.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=folder))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_loader_unpacks_a_repository_tarball_from_a_url_and_refuses_one_that_escapes(
    documents, tiny_repo, http_folder, tmp_path
):
    folder, url = http_folder
    with tarfile.open(folder / "models.tar.gz", "w:gz") as archive:
        archive.add(tiny_repo / "tiny-embed", arcname="./tiny-embed")
    repo = tmp_path / "claim"
    repo.mkdir()
    loaded = _run_loader(documents, repo, BERTSERVE_MODELS_SOURCE=f"{url}/models.tar.gz")
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    for path in (tiny_repo / "tiny-embed").rglob("*"):
        copy = repo / "tiny-embed" / path.relative_to(tiny_repo / "tiny-embed")
        assert copy.exists() and (path.is_dir() or copy.read_bytes() == path.read_bytes()), copy

    with tarfile.open(folder / "escape.tar", "w") as archive:
        member = tarfile.TarInfo("../../escaped/1/manifest.json")
        member.size = 2
        archive.addfile(member, io.BytesIO(b"{}"))
    other = tmp_path / "other" / "claim"
    other.mkdir(parents=True)
    refused = _run_loader(documents, other, BERTSERVE_MODELS_SOURCE=f"{url}/escape.tar")
    assert refused.returncode != 0 and "outside the destination" in refused.stderr, refused.stderr
    assert not list(tmp_path.rglob("escaped"))
