"""deploy/prometheus, deploy/grafana and docker-compose.yaml, checked without a running server:
promtool on the config and the rules (plus the rules' unit tests), and the files agreeing with each
other, with the Kubernetes settings and with the metric names of the README's Monitor table.

The live checks (promtool check metrics on a real scrape, a Prometheus server scraping bertserve and
every dashboard/alert query run against it) are in tests/test_deploy_runtime.py.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from tests.deploy_support import (
    DASHBOARD,
    DEPLOY,
    ROOT,
    alert_queries,
    dashboard_queries,
    documented_metrics,
    system_tool,
)

PROMETHEUS_DIR = DEPLOY / "prometheus"
COMPOSE = ROOT / "docker-compose.yaml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts_test.yml"


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [system_tool("promtool", "prometheus"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PROMETHEUS_DIR,
    )


def metric_names_in(query: str) -> set[str]:
    """bertserve_* metric names a query uses, with histogram suffixes folded into the family name."""
    names = set(re.findall(r"\bbertserve_[a-z_]+", query))
    return {re.sub(r"_(bucket|sum|count)$", "", name) for name in names}


def test_promtool_check_config():
    result = _promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_promtool_check_rules():
    result = _promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_unit_tests():
    """alerts_test.yml feeds synthetic series and asserts which alerts fire, when, with what text."""
    result = _promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_alert_rules_unit_tests_can_fail(tmp_path):
    """A rule with a wrong threshold breaks the unit tests: they assert something."""
    alerts = (PROMETHEUS_DIR / "alerts.yml").read_text().replace("> 0.05", "> 0.5")
    (tmp_path / "alerts.yml").write_text(alerts)
    (tmp_path / "alerts_test.yml").write_text((PROMETHEUS_DIR / "alerts_test.yml").read_text())
    result = subprocess.run(
        [system_tool("promtool", "prometheus"), "test", "rules", "alerts_test.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode != 0 and "BertserveHighErrorRate" in result.stdout + result.stderr


def test_queries_use_only_documented_metrics():
    documented = documented_metrics()
    assert "bertserve_queue_depth" in documented and "bertserve_padding_ratio" in documented
    for query in [*dashboard_queries(), *alert_queries().values()]:
        assert metric_names_in(query) <= documented, query


def test_queue_alert_threshold_follows_each_servers_configured_queue_limit():
    """No queue size is written into the rule: it compares with the limit each server exports, a setting
    that exists; the unit tests (alerts_test.yml) cover limits of 512, 1024 and 2048."""
    from bertserve.service.settings import Settings

    expr = alert_queries()["BertserveQueueSaturated"]
    assert re.search(r"0\.8 \* max by \(job, instance\) \(bertserve_limit\{name=\"(\w+)\"\}\)", expr)
    (limit,) = re.findall(r'bertserve_limit\{name="(\w+)"\}', expr)
    assert limit == "max_queue_inputs" and limit in Settings.model_fields
    assert not re.search(r"\b\d{3,}\b", expr), "a hard-coded queue size"
    tested_limits = set(
        re.findall(r'name="max_queue_inputs"\}\'\n\s+values: \'(\d+)x', ALERTS_TEST.read_text())
    )
    assert {"512", "1024", "2048"} <= tested_limits


def test_dashboard_has_the_promised_panels():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    queries = " ".join(dashboard_queries())
    for needed in (
        "rate(bertserve_requests_total",  # throughput
        "histogram_quantile(0.99, sum by (le, rpc) (rate(bertserve_request_duration_seconds_bucket",
        "bertserve_batch_size_",
        "bertserve_padding_ratio_",
        "bertserve_queue_depth",
        "sum by (code) (rate(bertserve_requests_total",  # errors by code
        "rate(bertserve_encoder_run_duration_seconds_sum",  # a batch's run beside its compute
        'bertserve_batch_cost_seconds{job="$job", instance=~"$instance", term="fixed"}',  # the cost cut's line
    ):
        assert needed in queries, needed
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
        assert [t["refId"] for t in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]


def test_compose_mounts_exist_and_match_the_grafana_provisioning():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert set(services) == {"bertserve", "prometheus", "grafana"}
    mounts = {}
    for service in services.values():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
                mounts[target] = ROOT / source
    provider = yaml.safe_load(
        (mounts["/etc/grafana/provisioning"] / "dashboards" / "bertserve.yaml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    assert (mounts["/var/lib/grafana/dashboards"] / DASHBOARD.name).exists()
    datasource = yaml.safe_load(
        (mounts["/etc/grafana/provisioning"] / "datasources" / "prometheus.yaml").read_text()
    )
    assert datasource["datasources"][0]["uid"] == "prometheus"
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    scrape = yaml.safe_load((mounts["/etc/prometheus"] / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == ["bertserve:8002"]
    bertserve = services["bertserve"]
    assert "50051:50051" in bertserve["ports"] and "8002:8002" in bertserve["ports"]
    stop = int(bertserve["stop_grace_period"].rstrip("s"))
    assert stop > float(bertserve["environment"]["BERTSERVE_GRACE_PERIOD_S"])


@pytest.mark.parametrize("query", dashboard_queries())
def test_dashboard_query_is_valid_promql_shape(query):
    """Cheap syntax guard: balanced brackets and only the Grafana variables the live test substitutes."""
    assert query.count("(") == query.count(")") and query.count("{") == query.count("}")
    assert set(re.findall(r"\$\w+", query)) <= {"$job", "$instance", "$__rate_interval"}
