"""The Deployment's memory limit holds the default models plus the most memory clients can make the server
hold at the Deployment's settings (service/supervisor/memory_bounds.py), with TLS on (its per-connection buffers
counted), so no hostile client can get a pod OOM-killed."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

from bertserve.service.settings import load_settings
from bertserve.service.supervisor import memory_bounds
from tests.deploy_support import memory_bytes, one, render_kustomize

ROOT = Path(__file__).resolve().parents[1]
# RSS of `bertserve serve` on the three default models with the ConfigMap's settings, after batches of every
# task at max_batch_tokens (docs/reliability.md, "Worst-case memory").
DEFAULT_MODELS_RSS = 534 * 1024 * 1024
MINILM_DIMENSION = 384


def _configmap_settings():
    lines = (ROOT / "deploy/kubernetes/base/bertserve.env").read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
    with mock.patch.dict(os.environ, env):
        return load_settings()


def test_the_memory_limit_holds_the_models_and_the_worst_case_of_the_settings():
    deployment = one(render_kustomize(ROOT / "deploy/kubernetes/base"), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    limit = memory_bytes(container["resources"]["limits"]["memory"])
    terms = memory_bounds.bounds(_configmap_settings(), MINILM_DIMENSION, tls=True)
    needed = DEFAULT_MODELS_RSS + sum(terms.values())
    assert needed <= limit, (
        f"the Deployment's memory limit {limit / 2**20:.0f} MiB is below the models' "
        f"{DEFAULT_MODELS_RSS / 2**20:.0f} MiB plus {memory_bounds.describe(terms)}"
    )
