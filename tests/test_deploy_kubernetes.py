"""deploy/kubernetes: render base and the overlays (gpu, own-models) with kustomize, validate every object
strictly, and check that the pieces agree with each other and with the server's settings; the
kube-prometheus-stack component is rendered through an overlay made here.

Built-in kinds are validated by kubernetes-validate in strict mode (unknown fields rejected). It has no
schema for the ServiceMonitor CRD (it only warns), so the ServiceMonitor is validated against the
subset of prometheus-operator's monitoring.coreos.com/v1 schema written below, strict as well.
"""

from __future__ import annotations

import copy
import os

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy_support import (
    DEPLOY,
    KUSTOMIZE_COMPONENTS,
    KUSTOMIZE_DIRS,
    by_kind,
    cpu_millis,
    deployment_workers,
    limit_cpus,
    one,
    render_kustomize,
)

# Oldest and newest Kubernetes versions the manifests are checked against.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
BASE_KINDS = [
    "ConfigMap",
    "Deployment",
    "HorizontalPodAutoscaler",
    "PodDisruptionBudget",
    "Service",
    "Service",
]
EXTRA_KINDS = {"own-models": ["ConfigMap", "PersistentVolumeClaim"]}  # the loader's, the claim

_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _LABELS},
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": _LABELS},
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array"}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                            "honorLabels": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}


@pytest.fixture(scope="module", params=list(KUSTOMIZE_DIRS))
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render_kustomize(KUSTOMIZE_DIRS[request.param])


def _container(documents: list[dict]) -> dict:
    (container,) = one(documents, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _settings_env(documents: list[dict]) -> dict[str, str]:
    """The server's settings: the ConfigMap its container takes its environment from."""
    (env_from,) = _container(documents)["envFrom"]
    return one(documents, "ConfigMap", env_from["configMapRef"]["name"])["data"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_strictly(rendered, version):
    name, documents = rendered
    kinds = sorted(doc["kind"] for doc in documents)
    assert kinds == sorted([*BASE_KINDS, "ServiceMonitor", *EXTRA_KINDS.get(name, [])])
    for doc in documents:
        if doc["kind"] == "ServiceMonitor":
            jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
        else:
            kubernetes_validate.validate(doc, version, strict=True)


def test_strict_mode_rejects_an_unknown_field(rendered):
    _, documents = rendered
    deployment = copy.deepcopy(one(documents, "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    monitor = copy.deepcopy(one(documents, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, SERVICE_MONITOR_SCHEMA)


def test_settings_configmap_is_valid_for_the_server(rendered, monkeypatch):
    from bertserve.service.settings import load_settings

    name, documents = rendered
    monkeypatch.delenv("BERTSERVE_HTTP_PORT", raising=False)  # tests/conftest.py sets it for test servers
    for key, value in _settings_env(documents).items():
        assert key.startswith("BERTSERVE_")
        monkeypatch.setenv(key, value)
    settings = load_settings()
    ports = {p["name"]: p["containerPort"] for p in _container(documents)["ports"]}
    served = {"grpc": settings.port, "metrics": settings.metrics_port, "http": settings.http_port}
    if settings.native_port >= 0:
        served["grpc-native"] = settings.native_port
    assert ports == served
    assert settings.host == "0.0.0.0"
    assert (settings.provider, settings.precision) == (("cuda", "fp16") if name == "gpu" else ("cpu", "fp32"))


def test_probes_call_grpc_health_on_the_grpc_port(rendered):
    _, documents = rendered
    container = _container(documents)
    grpc_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": grpc_port}, probe
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120  # time to load and warm up


def test_termination_grace_covers_prestop_and_drain(rendered):
    _, documents = rendered
    pod = one(documents, "Deployment")["spec"]["template"]["spec"]
    container = _container(documents)
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = float(_settings_env(documents)["BERTSERVE_GRACE_PERIOD_S"])
    assert pod["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + drain + 5


def test_pod_runs_locked_down(rendered):
    _, documents = rendered
    pod = one(documents, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    context = _container(documents)["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    resources = _container(documents)["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    threads = int(_settings_env(documents)["BERTSERVE_INTRA_OP_THREADS"])
    assert threads <= int(resources["limits"]["cpu"])


def test_workers_follow_the_cpu_limit(rendered, monkeypatch):
    """No manifest sets BERTSERVE_WORKERS: `auto` reads the container's CPU limit (requests == limits, so
    the request decides), which runs the single process on the base's 2 CPUs and several fronts on the
    GPU overlay's; the server's settings resolve to that count."""
    from bertserve.service import settings as settings_module

    name, documents = rendered
    container = _container(documents)
    resources = container["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"]
    env = _settings_env(documents)
    assert "BERTSERVE_WORKERS" not in env
    workers = deployment_workers(container, env)
    assert workers == settings_module.auto_workers(limit_cpus(container))
    assert workers > 1 if name == "gpu" else workers == 1
    monkeypatch.delenv("BERTSERVE_WORKERS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(settings_module, "usable_cpus", lambda: limit_cpus(container))
    assert settings_module.load_settings().worker_count() == workers


def test_an_overlay_sets_workers_in_its_configmap():
    """An overlay's env file with BERTSERVE_WORKERS outranks auto; an `env` entry on the container
    (which would hide the ConfigMap) is refused."""
    container = {"name": "bertserve", "resources": {"limits": {"cpu": "8"}}}
    assert deployment_workers(container, {}) == 7
    assert deployment_workers(container, {"BERTSERVE_WORKERS": "3"}) == 3
    with pytest.raises(AssertionError, match="would hide"):
        deployment_workers({**container, "env": [{"name": "BERTSERVE_WORKERS", "value": "2"}]}, {})


@pytest.mark.parametrize(("cpu", "cpus"), [("2", 2), ("500m", 1), ("1500m", 2), ("0.1", 1), (8, 8), ("8", 8)])
def test_usable_cpus_read_the_quota_the_kubelet_writes_for_a_limit(cpu, cpus, tmp_path, monkeypatch):
    """The kubelet writes a CPU limit as the cgroup quota (cpu.max: millicores x period / 1000 per
    period); `usable_cpus` rounds it up, as `limit_cpus` does for the rendered manifest."""
    from bertserve.service.settings import usable_cpus

    container = {"resources": {"limits": {"cpu": cpu}}}
    period = 100_000
    (tmp_path / "cpu.max").write_text(f"{cpu_millis(cpu) * period // 1000} {period}\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(64)))  # a 64-CPU node
    assert usable_cpus(tmp_path) == limit_cpus(container) == cpus


def test_selectors_and_references_agree(rendered):
    _, documents = rendered
    deployment = one(documents, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for service in by_kind(documents, "Service"):
        assert service["spec"]["selector"].items() <= pod_labels.items()
        container_ports = {p["name"] for p in _container(documents)["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    assert (
        one(documents, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    )
    env_from = _container(documents)["envFrom"][0]["configMapRef"]["name"]
    assert env_from in {c["metadata"]["name"] for c in by_kind(documents, "ConfigMap")}  # the hashed name
    monitor = one(documents, "ServiceMonitor")
    service = one(documents, "Service", "bertserve")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    hpa = one(documents, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "bertserve",
    }
    assert hpa["spec"]["minReplicas"] >= 2  # with the PDB's maxUnavailable 1, a drain never empties it


def test_hpa_scales_on_the_metric_prometheus_adapter_serves(rendered):
    _, documents = rendered
    metrics = one(documents, "HorizontalPodAutoscaler")["spec"]["metrics"]
    pods_metrics = [m["pods"]["metric"]["name"] for m in metrics if m["type"] == "Pods"]
    assert pods_metrics == ["bertserve_queue_depth"]
    rules = yaml.safe_load((DEPLOY / "prometheus" / "adapter-rules.yaml").read_text())["rules"]
    assert [rule["name"]["as"] for rule in rules] == pods_metrics
    assert rules[0]["seriesQuery"].startswith("bertserve_queue_depth{")


def test_gpu_overlay_asks_for_a_gpu_and_the_cuda_image():
    documents = render_kustomize(KUSTOMIZE_DIRS["gpu"])
    container = _container(documents)
    assert container["image"].endswith("-cuda")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    pod = one(documents, "Deployment")["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    metrics = one(documents, "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert [m["type"] for m in metrics] == ["Pods"]  # CPU says little about a GPU pod's load
    base = render_kustomize(KUSTOMIZE_DIRS["base"])
    assert _container(base)["image"].endswith("-cpu")
    assert "nvidia.com/gpu" not in _container(base)["resources"]["limits"]


def test_gpu_overlay_serves_its_grpc_port_with_the_native_transport():
    """The GPU overlay serves 50051 with the native transport (its fronts feed the GPU at less CPU per
    call), with no second port; the base keeps grpc.aio."""
    documents = render_kustomize(KUSTOMIZE_DIRS["gpu"])
    env = _settings_env(documents)
    assert env["BERTSERVE_GRPC_TRANSPORT"] == "native" and "BERTSERVE_NATIVE_PORT" not in env
    ports = {p["name"]: p["containerPort"] for p in _container(documents)["ports"]}
    assert ports["grpc"] == 50051 and "grpc-native" not in ports
    base = render_kustomize(KUSTOMIZE_DIRS["base"])
    assert "BERTSERVE_GRPC_TRANSPORT" not in _settings_env(base)  # grpc.aio by default


def test_gpu_bench_uses_the_gpu_overlays_batch_settings():
    from bertserve.bench import gpu

    env = _settings_env(render_kustomize(KUSTOMIZE_DIRS["gpu"]))
    assert {f"BERTSERVE_{k.upper()}": v for k, v in gpu.SERVER_SETTINGS.items()}.items() <= env.items()
    assert max(gpu.CEILING_BATCH_SIZES) == int(gpu.SERVER_SETTINGS["max_batch_size"])


def test_kube_prometheus_stack_component_labels_the_service_monitor(tmp_path):
    """An overlay as a user writes it: the base, the component, and a patch that names their release."""
    relative = {
        "base": os.path.relpath(KUSTOMIZE_DIRS["base"], tmp_path),
        "component": os.path.relpath(KUSTOMIZE_COMPONENTS / "kube-prometheus-stack", tmp_path),
    }
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [relative["base"]],
        "components": [relative["component"]],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    monitor = one(render_kustomize(tmp_path), "ServiceMonitor")
    jsonschema.validate(monitor, SERVICE_MONITOR_SCHEMA)
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/name"] == "bertserve"
    overlay["patches"] = [
        {
            "target": {"group": "monitoring.coreos.com", "kind": "ServiceMonitor", "name": "bertserve"},
            "patch": "- op: replace\n  path: /metadata/labels/release\n  value: monitoring\n",
        }
    ]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    assert one(render_kustomize(tmp_path), "ServiceMonitor")["metadata"]["labels"]["release"] == "monitoring"
    base_monitor = one(render_kustomize(KUSTOMIZE_DIRS["base"]), "ServiceMonitor")
    assert "release" not in base_monitor["metadata"]["labels"]
