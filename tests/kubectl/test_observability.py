"""The chart's Grafana dashboard and PrometheusRule ask only for metrics the real proxy exports: every
metric name in their queries is on the proxy's /metrics after traffic (agent and administrator calls,
TokenReviews included), as a sample, not only as a declared name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.chart.test_lint import CHART, render
from tests.kubectl.conftest import AGENT, MemoryWorld

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.valkey]

DASHBOARD = CHART / "dashboards" / "sessionmem.json"
_METRIC = re.compile(r"\b(sessionmem_[a-z0-9_]+)")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})? ")
# PromQL functions and labels never look like sessionmem_*: anything that matches is a metric name.


def _dashboard_queries(path: Path) -> list[str]:
    dashboard = json.loads(path.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return queries


def _alert_queries() -> list[str]:
    docs = render("--set", "metrics.prometheusRule.enabled=true")
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]


def _exported(text: str) -> set[str]:
    return {m.group(1) for line in text.splitlines() if (m := _SAMPLE.match(line)) and not line.startswith("#")}


def test_the_dashboard_is_importable_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    assert "__inputs" not in dashboard, "the sidecar imports it as it is: the data source is a variable"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(target["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"] for target in p["targets"])


def test_the_observability_objects_are_off_by_default_and_render_when_enabled() -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    enabled = render(
        "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
        "--set", "metrics.grafanaDashboard.enabled=true",
    )  # fmt: skip
    (monitor,) = [d for d in enabled if d["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    (config_map,) = [d for d in enabled if d["kind"] == "ConfigMap" and "sessionmem.json" in d.get("data", {})]
    assert json.loads(config_map["data"]["sessionmem.json"]) == json.loads(DASHBOARD.read_text())
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_every_metric_the_dashboard_and_alerts_query_is_exported_by_the_real_proxy(world: MemoryWorld) -> None:
    # Traffic on every path the panels and alerts look at: agent writes (the world), an administrator's
    # reads (their TokenReviews), a refused token (a rejected review).
    assert world.kubectl("bob-reader", "conversations", AGENT).code == 0
    httpx.get(f"{world.proxy.base_url}/v1/conversations", headers={"Authorization": "Bearer garbage"})
    text = httpx.get(f"{world.proxy.base_url}/metrics").text
    exported = _exported(text)
    histograms = {name.removesuffix("_bucket") for name in exported if name.endswith("_bucket")}
    assert histograms, text
    queried = {m for query in _dashboard_queries(DASHBOARD) + _alert_queries() for m in _METRIC.findall(query)}
    assert {"sessionmem_proxy_requests_total", "sessionmem_proxy_token_reviews_total"} <= queried
    missing = queried - exported
    assert not missing, f"queried but not exported: {sorted(missing)}; exported: {sorted(exported)}"
    assert 'sessionmem_proxy_token_reviews_total{kind="admin",result="authenticated"}' in text
    assert 'sessionmem_proxy_token_reviews_total{kind="agent",result="rejected"}' in text
    # An administrator's operations are counted like the agents', so the dashboard's panels show them.
    assert 'sessionmem_proxy_requests_total{op="admin_conversations",outcome="ok"} 1' in text
