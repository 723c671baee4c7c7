"""Knative Serving installed while the operator runs (issue #37): its Services are watched from then on,
without a restart. The real operator (KopfRunner) against a real kube-apiserver that starts without
Knative's CRDs; the resync is made too rare to help, so only a watch can carry Knative's status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessionmem_core import env, kube
from tests.harness import KubeTestCluster, knative_crd_paths
from tests.harness.fixtures import namespace_name_for
from tests.harness.operator import run_operator
from tests.operator.test_environments import PROXY_URL, agent_condition, seed_manifest
from tests.support.polling import poll

pytestmark = pytest.mark.integration

KSVC = "serving.knative.dev/v1"
# Knative's status must reach the AgentDeployment through the watch: well before a resync would run.
MIRROR_SECONDS = 15.0


def test_knative_installed_after_the_operator_started_is_watched(
    kube_cluster_without_knative: KubeTestCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    cluster = kube_cluster_without_knative
    ns = cluster.create_namespace(namespace_name_for(request.node.name))
    settings = {"resyncSeconds": 3600}
    with run_operator(cluster, tmp_path, settings=settings, environ={env.OPERATOR_PROXY_URL: PROXY_URL}):
        cluster.apply_manifests(seed_manifest(ns, name="before", executionModel="deployment"))
        agent_condition(cluster, ns, "MemoryReady", "True", "Wired", name="before")

        cluster.install_crds(knative_crd_paths())
        cluster.apply_manifests(seed_manifest(ns))
        ksvc: dict[str, Any] = poll(
            lambda: cluster.rest.get(KSVC, "Service", "support-agent", ns), "the Knative Service", 60.0
        )
        status = {
            "observedGeneration": ksvc["metadata"]["generation"],
            "url": f"http://support-agent.{ns}.example.com",
            "latestCreatedRevisionName": "support-agent-00001",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }
        path = f"/apis/{KSVC}/namespaces/{ns}/services/support-agent/status"
        cluster.rest.request("PATCH", path, body={"status": status}, content_type="application/merge-patch+json")

        def mirrored() -> dict[str, Any] | None:
            body = cluster.rest.get(kube.API_VERSION, kube.AGENT_KIND, "support-agent", ns) or {}
            return body if (body.get("status") or {}).get("url") == status["url"] else None

        poll(mirrored, "Knative's status on the AgentDeployment, through the watch", MIRROR_SECONDS)
    cluster.delete_namespace(ns)
