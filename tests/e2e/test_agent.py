"""Issue #19, step 2: the seed manifest (with `executionModel: deployment` and the demo agent image)
runs the agent with the launcher beside it, and a conversation through the agent's Service remembers
turn 1 in turn 2: the launcher reached the proxy with its kubelet-projected token."""

from __future__ import annotations

import json
import time

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


def test_conversation_through_the_agent_service_remembers_turn_one(
    e2e_cluster: E2ECluster, release: Release, namespace: str
) -> None:
    e2e_cluster.kubectl("apply", "-f", "-", stdin=_seed_manifest(namespace, e2e_cluster.demo_agent_image))
    e2e_cluster.kubectl(
        *("wait", "--for=condition=Ready", "agentdeployment/support-agent", "-n", namespace),
        f"--timeout={AGENT_READY_SECONDS}s",
        timeout=AGENT_READY_SECONDS + 10,
    )
    pod = json.loads(e2e_cluster.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"][0]
    assert len(pod["spec"]["containers"]) == 2, [c["name"] for c in pod["spec"]["containers"]]
    cluster_ip = e2e_cluster.kubectl(
        "get", "service/support-agent", "-n", namespace, "-o", "jsonpath={.spec.clusterIP}"
    )
    service_url = f"http://{cluster_ip}/"

    first = _turn(service_url, "e2e-conversation", "Hi, my name is Ada")
    second = _turn(service_url, "e2e-conversation", "What is my name?")
    stranger = _turn(service_url, "another-conversation", "What is my name?")

    assert "Ada" in first
    assert second == "Your name is Ada."
    assert "Ada" not in stranger
