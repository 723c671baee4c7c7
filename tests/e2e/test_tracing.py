"""Issue #19, step 3's second half: a turn's `memory.get` and `memory.append` spans reach an OTLP receiver
running in the cluster, the launcher's parented under the request's `traceparent` and the proxy's under
the launcher's (DESIGN.md section 7)."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest

from tests.e2e.agents import deploy_agent, turn
from tests.e2e.conftest import E2ECluster, OtlpReceiver, Release

pytestmark = pytest.mark.e2e

# The SDK's batch processor exports every 5 s; a pod's first export also waits for its start-up.
EXPORT_SECONDS = 60
EXPECTED = {(service, name) for service in ("sessionmem-launcher", "sessionmem-proxy") for name in ("get", "append")}


def _memory_spans(receiver: OtlpReceiver, trace_id: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The trace's memory.* spans by (service, operation), once all four expected have arrived."""
    deadline = time.monotonic() + EXPORT_SECONDS
    while True:
        spans = {
            (span["service"], span["name"].removeprefix("memory.")): span
            for span in receiver.spans(trace_id)
            if span["name"].startswith("memory.")
        }
        if set(spans) >= EXPECTED:
            return spans
        assert time.monotonic() < deadline, f"spans of trace {trace_id} so far: {sorted(spans)}"
        time.sleep(1)


def test_a_turns_memory_spans_reach_the_receiver_under_the_callers_trace(
    e2e_cluster: E2ECluster, release: Release, otlp_receiver: OtlpReceiver, namespace: str
) -> None:
    url = deploy_agent(e2e_cluster, namespace)
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)

    answer = turn(url, "e2e-traced", "Hi, my name is Barbara", {"traceparent": f"00-{trace_id}-{caller_span}-01"})
    assert answer.memory == "ok"
    spans = _memory_spans(otlp_receiver, trace_id)

    for op in ("get", "append"):
        launcher, proxy = spans[("sessionmem-launcher", op)], spans[("sessionmem-proxy", op)]
        assert launcher["parentSpanId"] == caller_span, launcher
        assert proxy["parentSpanId"] == launcher["spanId"], (proxy, launcher)
        for span in (launcher, proxy):
            assert span["attributes"]["memory.scope"] == "session", span
            assert span["attributes"]["memory.outcome"] == "ok", span
            assert span["attributes"]["memory.conversation_id"] == "e2e-traced", span
    assert spans[("sessionmem-proxy", "append")]["attributes"]["memory.version"] == 1
