"""The operator in the configurations a platform engineer may give it, each against a real kube-apiserver
with the real operator (kopf's KopfRunner): a cluster without Knative Serving, no proxy URL, and a
namespaced operator whose registry lists an agent it may not touch. Every wait is a bounded poll."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from sessionmem_core import env, kube
from tests.harness import KubeTestCluster
from tests.harness.fixtures import namespace_name_for
from tests.harness.operator import run_operator
from tests.support.polling import poll

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "support-agent.yaml"
PROXY_URL = "http://sessionmem-proxy.sessionmem.svc:8000"
# How long a wait may take before it fails: a guard against a hang, not a speed target (a wait returns as
# soon as its condition holds), so it is generous enough for a machine busy with other work.
WAIT_SECONDS = 60.0
T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = WAIT_SECONDS) -> T:
    return poll(probe, what, timeout)


def seed_manifest(namespace: str, name: str = "support-agent", **spec: Any) -> dict[str, Any]:
    """The DESIGN.md manifest (executionModel: serving, the default) in `namespace`."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"].update(spec)
    return doc


def conditions(body: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((body or {}).get("status") or {}).get("conditions") or []}


def agent_condition(
    cluster: KubeTestCluster, namespace: str, type_: str, status: str, reason: str, name: str = "support-agent"
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        body = cluster.rest.get(kube.API_VERSION, kube.AGENT_KIND, name, namespace)
        found = conditions(body).get(type_, {})
        current = ((body or {}).get("status") or {}).get("observedGeneration") == (body or {}).get("metadata", {}).get(
            "generation"
        )
        return found if current and (found.get("status"), found.get("reason")) == (status, reason) else None

    return wait_for(probe, f"{namespace}/{name} {type_}={status} {reason}")


def warnings_about(cluster: KubeTestCluster, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    listed = cluster.rest.request(
        "GET", f"/api/v1/namespaces/{namespace}/events", params={"fieldSelector": f"involvedObject.name={name}"}
    ).json()
    return [e for e in listed.get("items", []) if e.get("type") == "Warning" and e.get("reason") == reason]


def test_without_knative_the_seed_manifest_says_what_to_do(
    kube_cluster_without_knative: KubeTestCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    cluster = kube_cluster_without_knative
    ns = cluster.create_namespace(namespace_name_for(request.node.name))
    with run_operator(cluster, tmp_path, environ={env.OPERATOR_PROXY_URL: PROXY_URL}):
        cluster.apply_manifests(seed_manifest(ns))
        ready = agent_condition(cluster, ns, "Ready", "False", "KnativeServingNotInstalled")
        assert ready["message"] == "Knative Serving is not installed; use executionModel: deployment"
        memory = agent_condition(cluster, ns, "MemoryReady", "False", "KnativeServingNotInstalled")
        assert "executionModel: deployment" in memory["message"]
        (event,) = wait_for(
            lambda: warnings_about(cluster, ns, "support-agent", "KnativeServingNotInstalled"), "the Warning Event"
        )
        assert "use executionModel: deployment" in event["message"]

        # Following the advice works: a Deployment and a Service, memory wired.
        cluster.apply_manifests(seed_manifest(ns, executionModel="deployment"))
        agent_condition(cluster, ns, "MemoryReady", "True", "Wired")
        assert cluster.rest.get("apps/v1", "Deployment", "support-agent", ns) is not None
        cluster.delete_namespace(ns)


def test_without_a_proxy_url_memory_is_off_and_says_which_value_to_set(
    kube_cluster: KubeTestCluster, kube_namespace: str, tmp_path: Path
) -> None:
    ns = kube_namespace
    # What the chart renders for operator.proxyUrl=none: an empty variable.
    with run_operator(kube_cluster, tmp_path, environ={env.OPERATOR_PROXY_URL: ""}):
        kube_cluster.apply_manifests(seed_manifest(ns))
        memory = agent_condition(kube_cluster, ns, "MemoryReady", "False", "NoProxyConfigured")
        assert "operator.proxyUrl" in memory["message"]
        wait_for(lambda: warnings_about(kube_cluster, ns, "support-agent", "NoProxyConfigured"), "the Warning Event")
        ksvc = wait_for(
            lambda: kube_cluster.rest.get("serving.knative.dev/v1", "Service", "support-agent", ns), "the workload"
        )
        # No launcher that could only crash: the agent serves alone, and nothing points at a proxy.
        names = [c["name"] for c in ksvc["spec"]["template"]["spec"]["containers"]]
        assert names == ["agent"]
        assert env.PROXY_URL not in str(ksvc) and env.BACKEND_ADDR not in str(ksvc)


def test_a_registry_member_outside_the_watched_namespaces_is_reported_not_retried(
    kube_cluster: KubeTestCluster, kube_namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    watched = kube_namespace
    outside = kube_cluster.create_namespace(namespace_name_for(f"{request.node.name}-outside"))
    registry = f"team-{watched}"[:63]
    members = [{"namespace": watched, "name": "support-agent"}, {"namespace": outside, "name": "helper"}]
    try:
        operator_env = {env.OPERATOR_PROXY_URL: PROXY_URL, env.OPERATOR_NAMESPACE: "default"}
        with run_operator(kube_cluster, tmp_path, environ=operator_env, namespaces=[watched]):
            kube_cluster.apply_manifests(seed_manifest(watched, sessionMemory={"scope": "shared"}))
            kube_cluster.apply_manifests(seed_manifest(outside, name="helper", sessionMemory={"scope": "shared"}))
            kube_cluster.apply_manifests(
                {
                    "apiVersion": kube.API_VERSION,
                    "kind": kube.REGISTRY_KIND,
                    "metadata": {"name": registry},
                    "spec": {"members": members},
                }
            )

            def recorded() -> dict[str, Any] | None:
                body = kube_cluster.rest.get(kube.API_VERSION, kube.REGISTRY_KIND, registry)
                status = (body or {}).get("status") or {}
                return body if status.get("unreachableMembers") else None

            body = wait_for(recorded, "the registry status naming the unreachable member")
            assert body["status"]["unreachableMembers"] == [{"namespace": outside, "name": "helper"}]
            wired = conditions(body)["MembersWired"]
            assert (wired["status"], wired["reason"]) == ("False", "MembersOutsideWatchedNamespaces")
            assert f"{outside}/helper" in wired["message"] and "operator.watchNamespaces" in wired["message"]
            # Events about a cluster-scoped object go to the operator's namespace (here "default").
            (event,) = wait_for(
                lambda: warnings_about(kube_cluster, "default", registry, "MembersOutsideWatchedNamespaces"),
                "the registry's Warning Event",
            )
            assert event["involvedObject"]["kind"] == kube.REGISTRY_KIND
            # The watched member is wired into the team; the other was never touched.
            agent_condition(kube_cluster, watched, "MemoryReady", "True", "Wired")
            sa = kube.agent_service_account("helper")
            assert kube_cluster.rest.get("v1", "ServiceAccount", sa, outside) is None
            # The handler finished: no retry is pending (kopf keeps pending retries in progress annotations).
            annotations = (body["metadata"].get("annotations") or {}).keys()
            assert not [a for a in annotations if "/agent_registry" in a], annotations
    finally:
        kube_cluster.rest.delete(kube.API_VERSION, kube.REGISTRY_KIND, registry)
        kube_cluster.delete_namespace(outside)
