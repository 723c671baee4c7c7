"""Prometheus text exposition of the proxy's request counters and latencies (no client library needed
for a handful of series)."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Mapping

_BUCKETS_MS = (0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)


class ProxyMetrics:
    def __init__(self) -> None:
        self._requests: dict[tuple[str, str], int] = defaultdict(int)
        self._latency_buckets: dict[str, list[int]] = defaultdict(lambda: [0] * (len(_BUCKETS_MS) + 1))
        self._latency_sum_ms: dict[str, float] = defaultdict(float)

    def observe(self, op: str, outcome: str, latency_ms: float) -> None:
        self._requests[(op, outcome)] += 1
        # The first bucket whose bound is at least the latency; past the last bound, the overflow bucket.
        self._latency_buckets[op][bisect_left(_BUCKETS_MS, latency_ms)] += 1
        self._latency_sum_ms[op] += latency_ms

    def render(self, token_reviews: Mapping[str, Mapping[str, int]] | None = None) -> str:
        """``token_reviews``: TokenReview calls by who was being identified (``agent``, ``admin``), then by
        result (``authenticated``, ``rejected``, ``unavailable``)."""
        lines = [
            "# HELP sessionmem_proxy_requests_total Memory operations served, by operation and outcome.",
            "# TYPE sessionmem_proxy_requests_total counter",
        ]
        for (op, outcome), count in sorted(self._requests.items()):
            lines.append(f'sessionmem_proxy_requests_total{{op="{op}",outcome="{outcome}"}} {count}')
        lines += [
            "# HELP sessionmem_proxy_latency_ms Memory operation latency in milliseconds.",
            "# TYPE sessionmem_proxy_latency_ms histogram",
        ]
        for op, buckets in sorted(self._latency_buckets.items()):
            cumulative = 0
            for bound, count in zip((*_BUCKETS_MS, float("inf")), buckets, strict=True):
                cumulative += count
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f'sessionmem_proxy_latency_ms_bucket{{op="{op}",le="{le}"}} {cumulative}')
            lines.append(f'sessionmem_proxy_latency_ms_sum{{op="{op}"}} {self._latency_sum_ms[op]:.3f}')
            lines.append(f'sessionmem_proxy_latency_ms_count{{op="{op}"}} {cumulative}')
        lines += [
            "# HELP sessionmem_proxy_token_reviews_total TokenReview calls to the API server, by caller and result.",
            "# TYPE sessionmem_proxy_token_reviews_total counter",
        ]
        for kind, results in sorted((token_reviews or {}).items()):
            for result, count in sorted(results.items()):
                lines.append(f'sessionmem_proxy_token_reviews_total{{kind="{kind}",result="{result}"}} {count}')
        return "\n".join(lines) + "\n"
