"""Issue #19, step 3's second half: a turn's `memory.get` and `memory.append` spans reach an OTLP receiver
running in the cluster, the launcher's parented under the request's `traceparent` and the proxy's under
the launcher's (DESIGN.md section 7)."""

from __future__ import annotations

import secrets

import pytest

from tests.e2e.agents import DEPLOYMENT, SERVING, deploy_agent, turn
from tests.e2e.conftest import E2ECluster, OtlpReceiver, Release

pytestmark = pytest.mark.e2e

EXPECTED = {(service, name) for service in ("sessionmem-launcher", "sessionmem-proxy") for name in ("get", "append")}


# On Knative (issue #35) the turn passes the ingress and queue-proxy: the caller's span stays the parent.
@pytest.mark.parametrize("execution_model", [DEPLOYMENT, SERVING])
def test_a_turns_memory_spans_reach_the_receiver_under_the_callers_trace(
    e2e_cluster: E2ECluster, release: Release, otlp_receiver: OtlpReceiver, namespace: str, execution_model: str
) -> None:
    url = deploy_agent(e2e_cluster, namespace, execution_model=execution_model)
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)

    answer = turn(url, "e2e-traced", "Hi, my name is Barbara", {"traceparent": f"00-{trace_id}-{caller_span}-01"})
    assert answer.memory == "ok"
    spans = otlp_receiver.memory_spans(trace_id, EXPECTED)

    for op in ("get", "append"):
        launcher, proxy = spans[("sessionmem-launcher", op)], spans[("sessionmem-proxy", op)]
        assert launcher["parentSpanId"] == caller_span, launcher
        assert proxy["parentSpanId"] == launcher["spanId"], (proxy, launcher)
        for span in (launcher, proxy):
            assert span["attributes"]["memory.scope"] == "session", span
            assert span["attributes"]["memory.outcome"] == "ok", span
            assert span["attributes"]["memory.conversation_id"] == "e2e-traced", span
    assert spans[("sessionmem-proxy", "append")]["attributes"]["memory.version"] == 1
