"""The container's runtime stage, reproduced without Docker, and the monitoring stack against it.

A fresh venv gets exactly what the Dockerfile's `cpu` stage installs (`pip install` of the project, no
extras: onnxruntime, no torch), `bertserve serve` runs from it configured only by BERTSERVE_*
environment variables (as in the image), and then:
- grpc.health.v1 reports SERVING, and the Dockerfile's HEALTHCHECK command agrees;
- `promtool check metrics` passes on a live scrape of /metrics;
- a real Prometheus server (Debian's `prometheus`, on loopback) scrapes it with the shipped scrape
  config and alert rules, and answers PromQL: the request count, every Grafana dashboard query, every
  alert expression, and prometheus-adapter's queue-depth query for the HPA;
- SIGTERM drains and exits 0 within the grace period.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import grpc
import psutil
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertserve.v1 import inference_pb2, inference_pb2_grpc
from tests.deploy_support import (
    DEPLOY,
    KUSTOMIZE_DIRS,
    ROOT,
    LineReader,
    alert_queries,
    dashboard_queries,
    documented_metrics,
    free_port,
    http_get,
    memory_bytes,
    one,
    panel_queries,
    parse_dockerfile,
    render_kustomize,
    system_tool,
)

pytestmark = pytest.mark.timeout(600)

GRACE_PERIOD_S = 5
EMBED_CALLS = 12
# metrics that exist only under a setting this CPU server does not use, and why
ONLY_WHERE_SET = {"bertserve_batch_cost_seconds": "batch_cut cost: the default with shape buckets (CUDA)"}
LATE_CALLS = 6
GRAFANA_VARIABLES = {"$__rate_interval": "15s", "$instance": ".*", "$job": "bertserve"}
ADAPTER_POD = {"namespace": "bertserve-test", "pod": "bertserve-0"}


def _pip(venv, *args: str) -> None:
    command = [str(venv / "bin" / "pip"), "--disable-pip-version-check", "-q", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=480)
    if result.returncode != 0 and "Failed to establish a new connection" in result.stdout + result.stderr:
        pytest.skip("the package index cannot be reached from here: " + result.stderr.strip()[-300:])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory):
    """A fresh venv with the bertserve wheel (no extras) built from a copy of what the wheel stage copies."""
    work = tmp_path_factory.mktemp("runtime")
    source = work / "src"
    _, stages = parse_dockerfile(ROOT / "Dockerfile")
    (wheel_stage,) = [s for s in stages if s.name == "wheel"]
    source.mkdir()
    for copy in wheel_stage.all("COPY"):
        for name in copy.split()[:-1]:
            origin = ROOT / name
            if origin.is_dir():
                shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(origin, source / name)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # As in the Dockerfile: `pip wheel --no-deps` (wheel stage), then `pip install` of the wheel (cpu stage).
    _pip(venv, "wheel", "--no-deps", "--wheel-dir", str(work / "wheels"), str(source))
    (wheel,) = (work / "wheels").glob("bertserve-*.whl")
    _pip(venv, "install", str(wheel))
    return venv


def _clean_env(venv, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BERTSERVE_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    env.update(settings)
    return env


@pytest.fixture(scope="module")
def server(runtime_venv, default_repo, tmp_path_factory):
    """`bertserve serve` from the fresh venv, configured like the image: environment only."""
    env = _clean_env(
        runtime_venv,
        BERTSERVE_MODEL_REPO=str(default_repo),
        BERTSERVE_HOST="127.0.0.1",
        BERTSERVE_PORT="0",
        BERTSERVE_METRICS_PORT="0",
        BERTSERVE_HTTP_PORT="0",
        BERTSERVE_GRACE_PERIOD_S=str(GRACE_PERIOD_S),
        BERTSERVE_LOG_LEVEL="INFO",
    )
    process = subprocess.Popen(
        [str(runtime_venv / "bin" / "bertserve"), "serve"],
        env=env,
        cwd=tmp_path_factory.mktemp("cwd"),  # the source tree is not importable from here
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    log = LineReader(process.stderr)
    ready = log.wait_for(
        r"serving bertserve\.v1\.Inference on [\d.]+:(\d+), metrics on http://[\d.]+:(\d+)/", 240
    )
    assert ready, "server did not report serving:\n" + log.text()
    port, metrics_port = int(ready.group(1)), int(ready.group(2))
    http = log.wait_for(r"serving HTTP on http://[\d.]+:(\d+)/", 1)  # logged before the line above
    assert http, "server did not report its HTTP port:\n" + log.text()
    yield {
        "process": process,
        "port": port,
        "metrics_port": metrics_port,
        "http_port": int(http.group(1)),
        "log": log,
        "env": env,
    }
    if process.poll() is None:
        process.kill()
        process.wait(10)


def send_embed_calls(port: int, calls: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for i in range(calls):
            texts = [f"sentence {i} " + "word " * (4 * j) for j in range(1 + i % 4)]
            response = stub.Embed(inference_pb2.EmbedRequest(inputs=texts), timeout=30)
            assert len(response.embeddings) == len(texts) and len(response.embeddings[0].values) == 384


def send_http_embed_calls(http_port: int, calls: int) -> None:
    """OpenAI-style embeddings over the HTTP front, for the dashboard's HTTP panels."""
    for i in range(calls):
        body = json.dumps({"model": "all-minilm-l6-v2", "input": [f"sentence {i}"]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{http_port}/v1/embeddings",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert len(json.loads(response.read())["data"][0]["embedding"]) == 384


@pytest.fixture(scope="module")
def traffic(server):
    """EMBED_CALLS good Embed calls over gRPC and HTTP and one refused (blank input), so every panel has data."""
    send_embed_calls(server["port"], EMBED_CALLS)
    send_http_embed_calls(server["http_port"], LATE_CALLS)
    with grpc.insecure_channel(f"127.0.0.1:{server['port']}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Embed(inference_pb2.EmbedRequest(inputs=["  "]), timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return server


@pytest.fixture(scope="module")
def prometheus(traffic, tmp_path_factory):
    """Prometheus on 127.0.0.1 with the shipped config, retargeted at the server, 1 s scrapes."""
    work = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    (job,) = config["scrape_configs"]
    job.update(scrape_interval="1s", scrape_timeout="1s")
    job["static_configs"] = [{"targets": [f"127.0.0.1:{traffic['metrics_port']}"], "labels": ADAPTER_POD}]
    for rule_file in config["rule_files"]:
        shutil.copy2(DEPLOY / "prometheus" / rule_file, work / rule_file)
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    process = subprocess.Popen(
        [
            system_tool("prometheus", "prometheus"),
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = LineReader(process.stderr)
    try:
        assert log.wait_for("Server is ready to receive web requests", 60), log.text()
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)


def promql(base: str, query: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    body = json.loads(http_get(url))
    assert body["status"] == "success", (query, body)
    return body["data"]["result"]


def promql_until(base: str, query: str, done, timeout: float = 30) -> list[dict]:
    """Prometheus has no change notification: re-query (bounded) until the scrapes show `done`."""
    deadline = time.monotonic() + timeout
    while True:
        result = promql(base, query)
        if done(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def test_runtime_install_has_onnxruntime_and_no_torch(runtime_venv):
    python = str(runtime_venv / "bin" / "python")
    for module in ("torch", "transformers"):
        result = subprocess.run(
            [python, "-c", f"import {module}"], capture_output=True, text=True, timeout=60, cwd=runtime_venv
        )
        assert result.returncode != 0 and f"No module named '{module}'" in result.stderr
    ok = subprocess.run(
        [python, "-c", "import onnxruntime, bertserve.service.supervisor.server"],
        capture_output=True,
        timeout=120,
        cwd=runtime_venv,  # not the repository root, whose bertserve/ folder would shadow the install
    )
    assert ok.returncode == 0, ok.stderr


def test_wheel_installs_one_top_level_package_and_a_serving_only_cli(runtime_venv):
    """Everything importable lives under bertserve.*: nothing named service, export or bench lands in
    site-packages, and without the export extra `bertserve export` says in one line what to install."""
    python = str(runtime_venv / "bin" / "python")
    script = (
        "import importlib.metadata as m\n"
        "files = m.distribution('bertserve').files\n"
        "print(sorted({f.parts[0] for f in files if not f.parts[0].endswith(('.dist-info', '..'))}))\n"
    )

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=runtime_venv)

    listed = run(python, "-c", script)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "['bertserve']"
    for name in ("service", "export", "bench"):
        result = run(python, "-c", f"import {name}")
        assert f"No module named '{name}'" in result.stderr
    export = run(str(runtime_venv / "bin" / "bertserve"), "export", "--default", "--out", "unused")
    assert export.returncode == 1
    assert export.stderr.strip().count("\n") == 0 and "bertserve[export]" in export.stderr, export.stderr
    assert "Traceback" not in export.stderr


def test_health_is_serving(server):
    with grpc.insecure_channel(f"127.0.0.1:{server['port']}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "bertserve.v1.Inference"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def _healthcheck(server, port: int) -> subprocess.CompletedProcess:
    """The cpu stage's HEALTHCHECK command, run with the runtime venv's python."""
    _, stages = parse_dockerfile(ROOT / "Dockerfile")
    (healthcheck,) = [s for s in stages if s.name == "cpu"][0].all("HEALTHCHECK")
    command = json.loads(healthcheck.split(" CMD ", 1)[1])
    env = dict(server["env"], BERTSERVE_PORT=str(port))
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)


def test_dockerfile_healthcheck_passes_on_the_server_and_fails_without_one(server):
    assert _healthcheck(server, server["port"]).returncode == 0
    assert _healthcheck(server, free_port()).returncode != 0


def test_memory_fits_the_kubernetes_limit(traffic):
    """The server's resident memory with the default model, against the Deployment's limit."""
    rss = psutil.Process(traffic["process"].pid).memory_info().rss
    limits = one(render_kustomize(KUSTOMIZE_DIRS["base"]), "Deployment")["spec"]["template"]["spec"]
    limit = limits["containers"][0]["resources"]["limits"]["memory"]
    print(f"server RSS after traffic: {rss / 2**20:.0f} MiB (limit {limit})")
    assert rss < 0.75 * memory_bytes(limit)


def test_promtool_check_metrics_on_a_live_scrape(traffic):
    text = http_get(f"http://127.0.0.1:{traffic['metrics_port']}/metrics")
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE bertserve_")}
    assert families >= documented_metrics(), documented_metrics() - families
    result = subprocess.run(
        [system_tool("promtool", "prometheus"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_scrapes_the_server_and_answers_promql(prometheus):
    query = 'sum(bertserve_requests_total{job="bertserve", rpc="Embed", code="OK"})'
    result = promql_until(prometheus, query, lambda r: r and float(r[0]["value"][1]) >= EMBED_CALLS)
    assert result and float(result[0]["value"][1]) == EMBED_CALLS
    refused = promql(prometheus, 'bertserve_requests_total{rpc="Embed", code="INVALID_ARGUMENT"}')
    assert [float(r["value"][1]) for r in refused] == [1.0]
    (up,) = promql(prometheus, 'up{job="bertserve"}')
    assert up["value"][1] == "1" and up["metric"]["pod"] == ADAPTER_POD["pod"]


def _grafana(query: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        query = query.replace(variable, value)
    return query


def test_every_dashboard_query_runs_and_the_panels_have_data(prometheus, traffic):
    # Fresh calls while Prometheus scrapes, so rate() windows hold them; wait until scraped.
    send_embed_calls(traffic["port"], LATE_CALLS)
    send_http_embed_calls(traffic["http_port"], LATE_CALLS)
    total = "sum(bertserve_requests_total{code='OK'})"
    promql_until(prometheus, total, lambda r: r and float(r[0]["value"][1]) >= EMBED_CALLS + 3 * LATE_CALLS)
    empty = [query for query in dashboard_queries() if not promql(prometheus, _grafana(query))]
    # every query runs (promql raises otherwise); these have data only where a setting makes it
    assert [q for q in empty if not any(metric in q for metric in ONLY_WHERE_SET)] == [], (
        "panels without data"
    )
    (requests_per_s,) = panel_queries("Requests/s")
    (throughput,) = promql(prometheus, _grafana(requests_per_s))
    assert float(throughput["value"][1]) > 0
    (p99_query,) = panel_queries("p99 latency (all RPCs)")
    (p99,) = promql(prometheus, _grafana(p99_query))
    assert 0 < float(p99["value"][1]) < 30


def test_alert_rules_load_and_evaluate_without_error(prometheus):
    for expr in alert_queries().values():
        promql(prometheus, expr)  # valid PromQL on real series (none fires under this light load)
    rules = json.loads(http_get(f"{prometheus}/api/v1/rules"))["data"]["groups"]
    loaded = {rule["name"]: rule for group in rules for rule in group["rules"]}
    assert set(loaded) == set(alert_queries())
    for name, rule in loaded.items():
        assert rule["health"] in ("ok", "unknown"), (name, rule.get("lastError"))
        assert rule["state"] == "inactive", name


def test_prometheus_adapter_query_gives_the_hpa_a_per_pod_queue_depth(prometheus):
    (rule,) = yaml.safe_load((DEPLOY / "prometheus" / "adapter-rules.yaml").read_text())["rules"]
    matchers = ",".join(f'{k}="{v}"' for k, v in ADAPTER_POD.items())
    query = (
        rule["metricsQuery"]
        .replace("<<.Series>>", rule["name"]["as"])
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", "pod")
    )
    (series,) = promql(prometheus, query)
    assert series["metric"] == {"pod": ADAPTER_POD["pod"]}
    assert float(series["value"][1]) == 0.0  # idle now: nothing queued


def test_sigterm_drains_and_exits_zero_within_the_grace_period(server):
    """Last in the module: stops the shared server the way Kubernetes and Docker do."""
    process = server["process"]
    process.send_signal(signal.SIGTERM)
    assert process.wait(GRACE_PERIOD_S + 10) == 0, server["log"].text()
    assert server["log"].wait_for("stopped", 5), server["log"].text()
    assert _healthcheck(server, server["port"]).returncode != 0
