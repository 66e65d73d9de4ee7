"""The Deployment's memory limit holds the default models plus the most memory clients can make the server
hold at the Deployment's settings (service/supervisor/memory_bounds.py), with TLS on (its per-connection
buffers counted), so no hostile client can get a pod OOM-killed. The processes follow the CPU limit
(`workers auto`): one runs the models and the bounds; with several fronts the bounds are per front, so they
count once per front, and so does each front's own memory (its tokenizers, no ONNX Runtime session), plus
the supervisor once."""

from __future__ import annotations

import os

import pytest

from bertserve.service.settings import load_settings
from bertserve.service.supervisor import memory_bounds
from tests.deploy_support import KUSTOMIZE_DIRS, deployment_workers, memory_bytes, one, render_kustomize

MIB = 1024 * 1024
# RSS of `bertserve serve` on the four default models with the ConfigMap's settings, after batches of every
# task at max_batch_tokens (docs/reliability.md, "Worst-case memory"): the single process; the engine of
# several holds a little less (754 MiB with `--workers 2`). 778 MiB measured, plus what was measured since for
# the tokenizer's plain-text twin (2.3 MiB, service/engine/plain_text.py) and its C++ WordPiece's vocabulary
# table (2.6 MiB, service/engine/native_wordpiece/), rounded up.
DEFAULT_MODELS_RSS = 783 * MIB
# The same on CUDA (the gpu overlay): host memory of the CUDA context, cuDNN and the sessions. Not measured:
# the 4 GiB the overlay gave its single process, less the worst case of that process's bounds (960 MiB).
CUDA_MODELS_RSS = 3072 * MIB
# Measured: `bertserve serve --workers 2` on the four default models with the ConfigMap's settings, each
# process's VmRSS from /proc, at its peak after 16 concurrent clients sent batches of every task twice
# (embed at max_batch_tokens, classify, fill-mask, rerank of 32 long documents): a front, and the
# supervisor (39 MiB, then 0.9 MiB more measured since it resolves the models' versions itself). Rounded up.
FRONT_RSS = 190 * MIB
SUPERVISOR_RSS = 41 * MIB
MINILM_DIMENSION = 384
MODELS_RSS = {"base": DEFAULT_MODELS_RSS, "gpu": CUDA_MODELS_RSS}


def _settings_env(documents: list[dict], container: dict) -> dict[str, str]:
    (env_from,) = container["envFrom"]
    return one(documents, "ConfigMap", env_from["configMapRef"]["name"])["data"]


def needed_bytes(models: int, workers: int, per_front_bounds: int) -> int:
    """One process (workers 1) holds the models and the bounds; more hold the engine's models, the
    supervisor and, per front, its own memory and its bounds."""
    if workers == 1:
        return models + per_front_bounds
    return models + SUPERVISOR_RSS + workers * (FRONT_RSS + per_front_bounds)


@pytest.mark.parametrize(("name", "processes"), [("base", "single"), ("gpu", "several")])
def test_the_memory_limit_holds_the_models_and_the_worst_case_of_the_settings(name, processes, monkeypatch):
    documents = render_kustomize(KUSTOMIZE_DIRS[name])
    (container,) = one(documents, "Deployment")["spec"]["template"]["spec"]["containers"]
    limit = memory_bytes(container["resources"]["limits"]["memory"])
    for key in [k for k in os.environ if k.startswith("BERTSERVE_")]:  # tests/conftest.py sets some
        monkeypatch.delenv(key)
    env = _settings_env(documents, container)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    terms = memory_bounds.bounds(load_settings(), MINILM_DIMENSION, tls=True)
    workers = deployment_workers(container, env)
    assert (workers == 1) == (processes == "single"), f"{name}: {workers} workers"
    needed = needed_bytes(MODELS_RSS[name], workers, sum(terms.values()))
    fronts = "" if workers == 1 else f", the supervisor's {SUPERVISOR_RSS / MIB:.0f} MiB and, for each of "
    fronts += "" if workers == 1 else f"{workers} fronts, its own {FRONT_RSS / MIB:.0f} MiB and"
    assert needed <= limit, (
        f"{name}: the Deployment's memory limit {limit / MIB:.0f} MiB is below {needed / MIB:.0f} MiB: the "
        f"models' {MODELS_RSS[name] / MIB:.0f} MiB{fronts} {memory_bounds.describe(terms)}"
    )
