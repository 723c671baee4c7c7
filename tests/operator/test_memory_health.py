"""MemoryReady follows memory's health, not only its wiring (issue #37): the real operator (KopfRunner)
against a real kube-apiserver, probing a real proxy in front of a real valkey-server.

- Valkey stops: the proxy answers its /readyz with 503, and MemoryReady goes False
  (MemoryBackendUnavailable) with the proxy's address and cause; Valkey back: True again.
- The proxy stops: MemoryReady False (ProxyUnreachable).
- The agent's pods fail (the launcher exits, e.g. on a tokenCounter it cannot import): Knative reports its
  revision failed, and MemoryReady goes False (AgentNotRunning) naming that cause. No Knative controller
  runs here: the test writes the status Knative's controller writes for such a revision.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from sessionmem_core import env
from tests.harness import KubeTestCluster
from tests.harness.operator import run_operator
from tests.operator.test_environments import agent_condition, seed_manifest
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess

pytestmark = pytest.mark.integration

KSVC = "serving.knative.dev/v1"
SETTINGS = {"memoryHealthSeconds": 1}


def knative_status(cluster: KubeTestCluster, namespace: str, ready: dict[str, Any]) -> None:
    """Write what Knative's controller writes on the agent's Service: its Ready condition."""
    ksvc = cluster.rest.get(KSVC, "Service", "support-agent", namespace)
    assert ksvc is not None
    status = {
        "observedGeneration": ksvc["metadata"]["generation"],
        "latestCreatedRevisionName": "support-agent-00001",
        "conditions": [{"lastTransitionTime": "2026-01-01T00:00:00Z", **ready}],
    }
    path = f"/apis/{KSVC}/namespaces/{namespace}/services/support-agent/status"
    cluster.rest.request("PATCH", path, body={"status": status}, content_type="application/merge-patch+json")


def test_memory_ready_follows_the_backend_down_and_up(
    kube_cluster: KubeTestCluster,
    kube_namespace: str,
    tmp_path: Path,
    valkey_server: ValkeyProcess,
    proxy_process: ServiceProcess,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ns = kube_namespace
    proxy = proxy_process.base_url
    caplog.set_level(logging.INFO, logger="sessionmem.operator.backend")
    with run_operator(kube_cluster, tmp_path, settings=SETTINGS, environ={env.OPERATOR_PROXY_URL: proxy}):
        kube_cluster.apply_manifests(seed_manifest(ns))
        agent_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")

        valkey_server.stop()
        down = agent_condition(kube_cluster, ns, "MemoryReady", "False", "MemoryBackendUnavailable")
        assert f"{proxy}/readyz" in down["message"] and "HTTP 503" in down["message"]
        assert "memory backend unavailable" in down["message"], "the proxy's cause is carried"

        valkey_server.start()
        agent_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")

        proxy_process.stop()
        gone = agent_condition(kube_cluster, ns, "MemoryReady", "False", "ProxyUnreachable")
        assert f"{proxy}/readyz" in gone["message"]
        proxy_process.start()
        agent_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")

    # Each change was logged once, with the address and the cause.
    lines = [r.getMessage() for r in caplog.records if r.name == "sessionmem.operator.backend"]
    downs = [line for line in lines if line.startswith("memory backend down")]
    ups = [line for line in lines if line.startswith("memory backend up")]
    assert len(downs) == 2 and len(ups) == 2, lines
    assert "memory backend unavailable" in downs[0] and f"{proxy}/readyz" in downs[0]


def test_failing_agent_pods_make_memory_not_ready(
    kube_cluster: KubeTestCluster,
    kube_namespace: str,
    tmp_path: Path,
    proxy_process: ServiceProcess,
) -> None:
    ns = kube_namespace
    environ = {env.OPERATOR_PROXY_URL: proxy_process.base_url}
    with run_operator(kube_cluster, tmp_path, settings=SETTINGS, environ=environ):
        memory = {"scope": "session", "replayTokens": 2000, "tokenCounter": "nosuchpkg.counter:count"}
        kube_cluster.apply_manifests(seed_manifest(ns, sessionMemory=memory))
        agent_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")

        # What Knative reports when the launcher exits at start-up: the revision failed.
        cause = "Container failed with: ModuleNotFoundError: No module named 'nosuchpkg'"
        knative_status(
            kube_cluster,
            ns,
            {"type": "Ready", "status": "False", "reason": "RevisionFailed", "message": cause},
        )
        failed = agent_condition(kube_cluster, ns, "MemoryReady", "False", "AgentNotRunning")
        assert cause in failed["message"] and "sessionmem-launcher" in failed["message"]

        # Fixed (a new revision up): memory is ready again.
        knative_status(kube_cluster, ns, {"type": "Ready", "status": "True"})
        agent_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")
