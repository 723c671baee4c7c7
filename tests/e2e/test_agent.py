"""Issue #19, step 2: the seed manifest (with `executionModel: deployment` and the demo agent image)
runs the agent with the launcher beside it, and a conversation through the agent's Service remembers
turn 1 in turn 2: the launcher reached the proxy with its kubelet-projected token."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import E2ECluster, Release

pytestmark = pytest.mark.e2e

AGENT_READY_SECONDS = 180


def _seed_manifest(namespace: str, image: str) -> str:
    # DESIGN.md section 1's manifest, with the local demo image and the Knative-free execution model.
    return json.dumps(
        {
            "apiVersion": "agents.ctxmesh.ai/v1beta1",
            "kind": "AgentDeployment",
            "metadata": {"name": "support-agent", "namespace": namespace},
            "spec": {"image": image, "executionModel": "deployment", "sessionMemory": {"scope": "session"}},
        }
    )


def _turn(service_url: str, conversation_id: str, text: str) -> str:
    """One managed-loop turn through the Service; retried while the Service's endpoint is programmed."""
    deadline = time.monotonic() + 30
    while True:
        try:
            response = httpx.post(
                service_url, json={"input": text}, headers={"X-Conversation-Id": conversation_id}, timeout=10
            )
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert response.status_code == 200, response.text
    output: str = response.json()["output"]
    return output


def _wait_agent_ready(cluster: E2ECluster, namespace: str) -> None:
    cluster.kubectl(
        *("wait", "--for=condition=Ready", "agentdeployment/support-agent", "-n", namespace),
        f"--timeout={AGENT_READY_SECONDS}s",
        timeout=AGENT_READY_SECONDS + 10,
    )


def _deploy_seed_agent(cluster: E2ECluster, namespace: str) -> str:
    """Applies the seed manifest, waits for the AgentDeployment to be Ready; returns its Service's URL."""
    cluster.kubectl("apply", "-f", "-", stdin=_seed_manifest(namespace, cluster.demo_agent_image))
    _wait_agent_ready(cluster, namespace)
    cluster_ip = cluster.kubectl("get", "service/support-agent", "-n", namespace, "-o", "jsonpath={.spec.clusterIP}")
    return f"http://{cluster_ip}/"


def _agent_pods(cluster: E2ECluster, namespace: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]
    return pods


def test_conversation_through_the_agent_service_remembers_turn_one(
    e2e_cluster: E2ECluster, release: Release, namespace: str
) -> None:
    service_url = _deploy_seed_agent(e2e_cluster, namespace)
    (pod,) = _agent_pods(e2e_cluster, namespace)
    assert len(pod["spec"]["containers"]) == 2, [c["name"] for c in pod["spec"]["containers"]]

    first = _turn(service_url, "e2e-conversation", "Hi, my name is Ada")
    second = _turn(service_url, "e2e-conversation", "What is my name?")
    stranger = _turn(service_url, "another-conversation", "What is my name?")

    assert "Ada" in first
    assert second == "Your name is Ada."
    assert "Ada" not in stranger


def test_a_cold_pod_after_scale_to_zero_recalls_the_conversation(
    e2e_cluster: E2ECluster, release: Release, namespace: str
) -> None:
    service_url = _deploy_seed_agent(e2e_cluster, namespace)
    _turn(service_url, "e2e-cold", "Hi, my name is Grace")
    (warm_pod,) = _agent_pods(e2e_cluster, namespace)

    e2e_cluster.kubectl("scale", "deployment/support-agent", "-n", namespace, "--replicas=0")
    deadline = time.monotonic() + AGENT_READY_SECONDS
    while _agent_pods(e2e_cluster, namespace):
        assert time.monotonic() < deadline, "the agent's pods did not go away after scaling to zero"
        time.sleep(0.5)
    e2e_cluster.kubectl("scale", "deployment/support-agent", "-n", namespace, "--replicas=1")
    e2e_cluster.kubectl(
        *("rollout", "status", "deployment/support-agent", "-n", namespace, f"--timeout={AGENT_READY_SECONDS}s"),
        timeout=AGENT_READY_SECONDS + 10,
    )
    (cold_pod,) = _agent_pods(e2e_cluster, namespace)

    assert cold_pod["metadata"]["uid"] != warm_pod["metadata"]["uid"]
    assert _turn(service_url, "e2e-cold", "What is my name?") == "Your name is Grace."
