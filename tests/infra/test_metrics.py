"""The proxy's latency histogram: each observation lands in the first bucket whose bound it does not
exceed (Prometheus ``le``), and the rendered buckets are cumulative."""

from __future__ import annotations

import re

from sessionmem_infra.telemetry import ProxyMetrics


def _buckets(text: str, op: str) -> dict[str, int]:
    pattern = re.compile(rf'^sessionmem_proxy_latency_ms_bucket{{op="{op}",le="([^"]+)"}} (\d+)$', re.M)
    return {le: int(count) for le, count in pattern.findall(text)}


def test_an_observation_on_a_bound_counts_in_that_bound_s_bucket() -> None:
    metrics = ProxyMetrics()
    for latency in (0.5, 0.51, 1.0, 999.0, 1000.0, 1000.1, 0.0):
        metrics.observe("append", "ok", latency)
    buckets = _buckets(metrics.render(), "append")
    assert buckets["0.5"] == 2  # 0.0 and 0.5
    assert buckets["1.0"] == 4  # and 0.51, 1.0
    assert buckets["250.0"] == 4
    assert buckets["1000.0"] == 6  # and 999.0, 1000.0
    assert buckets["+Inf"] == 7  # and 1000.1
    assert 'sessionmem_proxy_latency_ms_count{op="append"} 7' in metrics.render()


def test_operations_and_outcomes_are_counted_apart() -> None:
    metrics = ProxyMetrics()
    metrics.observe("get", "ok", 0.2)
    metrics.observe("get", "rate_limited", 0.2)
    metrics.observe("append", "ok", 3.0)
    text = metrics.render()
    assert 'sessionmem_proxy_requests_total{op="get",outcome="ok"} 1' in text
    assert 'sessionmem_proxy_requests_total{op="get",outcome="rate_limited"} 1' in text
    assert _buckets(text, "get")["0.5"] == 2
    assert _buckets(text, "append")["2.5"] == 0
    assert _buckets(text, "append")["5.0"] == 1
