"""The operator (the real ``python -m sessionmem_operator`` process) SIGKILLed in the middle of reconciling
a burst of AgentDeployments and restarted, and the kube-apiserver SIGKILLed and restarted under it: no
duplicate children, no status lost, no spurious new revision, and everything converges.

A control plane of its own (its API server gets restarted), not the session's shared ``kube_cluster``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from sessionmem_core import env, kube
from tests.faults.kube import OperatorProcess, RestartableKubeCluster
from tests.harness import KubeApiError, KubeRestClient, knative_crd_paths, repo_crd_paths
from tests.support.polling import poll

pytestmark = pytest.mark.integration

KSVC = "serving.knative.dev/v1"
NAMESPACE = "faults"
BURST = 10
CONVERGE_SECONDS = 60.0
T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = CONVERGE_SECONDS) -> T:
    return poll(probe, what, timeout, tolerate=(httpx.HTTPError, KubeApiError))


@pytest.fixture(scope="module")
def cluster() -> Iterator[RestartableKubeCluster]:
    control_plane = RestartableKubeCluster(crd_paths=[*knative_crd_paths(), *repo_crd_paths()])
    control_plane.start()
    control_plane.create_namespace(NAMESPACE)
    try:
        yield control_plane
    finally:
        control_plane.stop()


@pytest.fixture(scope="module")
def operator(cluster: RestartableKubeCluster) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(cluster)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        print(f"operator log: {proc.log_path}")


def manifest(name: str, **memory: Any) -> dict[str, Any]:
    return {
        "apiVersion": kube.API_VERSION,
        "kind": kube.AGENT_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "image": "ghcr.io/my-org/support-agent:1.4.0",
            "executionModel": "serving",
            "sessionMemory": {"scope": "session", **memory},
        },
    }


def agent(cluster: RestartableKubeCluster, name: str) -> dict[str, Any] | None:
    return cluster.rest.get(kube.API_VERSION, kube.AGENT_KIND, name, NAMESPACE)


def condition(body: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for item in ((body or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == type_:
            return dict(item)
    return {}


def converged(cluster: RestartableKubeCluster, name: str) -> dict[str, Any] | None:
    body = agent(cluster, name)
    if body is None:
        return None
    status = body.get("status") or {}
    if status.get("observedGeneration") != body["metadata"]["generation"]:
        return None
    if condition(body, "MemoryReady").get("status") != "True":
        return None
    return body if cluster.rest.get(KSVC, "Service", name, NAMESPACE) is not None else None


def listed(cluster: RestartableKubeCluster, path: str, name: str) -> list[dict[str, Any]]:
    selector = f"{kube.LABEL_AGENT}={name}"
    items: list[dict[str, Any]] = cluster.rest.request("GET", path, params={"labelSelector": selector}).json()["items"]
    return items


def assert_children_unique(cluster: RestartableKubeCluster, name: str) -> None:
    """Exactly one Knative Service and one ServiceAccount, each with one controller owner: this agent."""
    uid = agent(cluster, name)["metadata"]["uid"]  # type: ignore[index]
    ksvcs = listed(cluster, f"/apis/{KSVC}/namespaces/{NAMESPACE}/services", name)
    accounts = listed(cluster, f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", name)
    deployments = listed(cluster, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", name)
    assert [k["metadata"]["name"] for k in ksvcs] == [name], ksvcs
    assert [a["metadata"]["name"] for a in accounts] == [kube.agent_service_account(name)], accounts
    assert deployments == []
    for child in (*ksvcs, *accounts):
        owners = child["metadata"]["ownerReferences"]
        assert len(owners) == 1 and owners[0]["uid"] == uid and owners[0]["controller"] is True, owners


def make_knative_ready(cluster: RestartableKubeCluster, name: str) -> None:
    """What Knative's controller would write once the revision is up (there is no Knative controller here)."""
    ksvc = cluster.rest.get(KSVC, "Service", name, NAMESPACE)
    assert ksvc is not None
    status = {
        "observedGeneration": ksvc["metadata"]["generation"],
        "url": f"http://{name}.{NAMESPACE}.example.com",
        "latestCreatedRevisionName": f"{name}-00001",
        "latestReadyRevisionName": f"{name}-00001",
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            for t in ("Ready", "ConfigurationsReady", "RoutesReady")
        ],
    }
    path = f"/apis/{KSVC}/namespaces/{NAMESPACE}/services/{name}/status"
    cluster.rest.request("PATCH", path, body={"status": status}, content_type="application/merge-patch+json")


def ksvc_generation(cluster: RestartableKubeCluster, name: str) -> int:
    ksvc = cluster.rest.get(KSVC, "Service", name, NAMESPACE)
    assert ksvc is not None
    return int(ksvc["metadata"]["generation"])


def test_operator_sigkilled_mid_reconcile_restarts_without_duplicates_or_lost_status(
    cluster: RestartableKubeCluster, operator: OperatorProcess
) -> None:
    # One agent fully done, and Ready (Knative "reported" its revision up).
    cluster.apply_manifests(manifest("steady"))
    wait_for(lambda: converged(cluster, "steady"), "steady to converge")
    make_knative_ready(cluster, "steady")
    wait_for(lambda: condition(agent(cluster, "steady"), "Ready").get("status") == "True", "steady Ready")
    steady_generation = ksvc_generation(cluster, "steady")

    # A burst, and the operator SIGKILLed as soon as it has made some but not all of the children.
    # It is applied from a thread (with a client of its own) while this one watches for the first child.
    names = [f"burst-{n}" for n in range(BURST)]

    def apply_burst() -> None:
        with KubeRestClient(cluster.server_url, cluster.ca_path, cluster.admin_token) as rest:
            for name in names:
                rest.apply(manifest(name))

    applying = threading.Thread(target=apply_burst)
    applying.start()
    wait_for(lambda: any(cluster.rest.get(KSVC, "Service", n, NAMESPACE) for n in names[:2]), "a first child", 30)
    operator.kill()
    applying.join(timeout=60)
    done_at_kill = sum(1 for n in names if converged(cluster, n))
    print(f"operator SIGKILLed with {done_at_kill}/{BURST} agents of the burst converged")
    assert done_at_kill < BURST, "the kill should land mid-reconcile"

    restarted = time.monotonic()
    operator.start()
    for name in names:
        wait_for(lambda n=name: converged(cluster, n), f"{name} to converge after the restart")  # type: ignore[misc]
    print(f"burst converged {time.monotonic() - restarted:.1f}s after the operator restart")

    for name in ["steady", *names]:
        assert_children_unique(cluster, name)
        body = agent(cluster, name)
        assert body is not None
        assert body["status"]["keyPrefix"] == f"mem:{NAMESPACE}/{name}:"
        assert condition(body, "MemoryReady")["reason"] == "Wired"
    # Nothing lost or rolled for the agent that was already done: still Ready, same revision.
    steady = agent(cluster, "steady")
    assert condition(steady, "Ready")["status"] == "True"
    assert steady is not None and steady["status"]["latestRevision"] == "steady-00001"
    assert ksvc_generation(cluster, "steady") == steady_generation


def test_apiserver_sigkilled_and_restarted_under_the_operator_converges(
    cluster: RestartableKubeCluster, operator: OperatorProcess
) -> None:
    starts = operator.starts
    cluster.apply_manifests(manifest("before-outage"))
    wait_for(lambda: converged(cluster, "before-outage"), "before-outage to converge")
    generation = ksvc_generation(cluster, "before-outage")

    # Changes land, then the API server dies under the operator while it works on them.
    cluster.apply_manifests(manifest("before-outage", replayMessages=12))
    for n in range(3):
        cluster.apply_manifests(manifest(f"during-{n}"))
    cluster.stop_apiserver()
    time.sleep(2.0)
    ready_after = cluster.start_apiserver()
    back = time.monotonic()
    print(f"kube-apiserver back (ready {ready_after:.1f}s after its restart)")

    # A change made after the restart is picked up too: the operator's watches came back by themselves.
    cluster.apply_manifests(manifest("after-outage"))

    def launcher_replay(name: str) -> str | None:
        ksvc = cluster.rest.get(KSVC, "Service", name, NAMESPACE)
        if ksvc is None:
            return None
        containers = {c["name"]: c for c in ksvc["spec"]["template"]["spec"]["containers"]}
        variables = {e["name"]: e.get("value") for e in containers["sessionmem-launcher"].get("env", [])}
        return variables.get(env.REPLAY_MESSAGES)

    for name in ["before-outage", "during-0", "during-1", "during-2", "after-outage"]:
        wait_for(lambda n=name: converged(cluster, n), f"{name} to converge after the API server restart")  # type: ignore[misc]
    wait_for(lambda: launcher_replay("before-outage") == "12", "the spec change to reach the launcher env")
    print(f"everything converged {time.monotonic() - back:.1f}s after the API server was back")

    assert operator.alive() and operator.starts == starts, "the operator must survive the outage without a restart"
    assert ksvc_generation(cluster, "before-outage") == generation + 1  # exactly one new revision
    for name in ["before-outage", "during-0", "during-1", "during-2", "after-outage"]:
        assert_children_unique(cluster, name)
