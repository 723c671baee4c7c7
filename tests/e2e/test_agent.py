"""Issue #19, step 2: the seed manifest (with `executionModel: deployment` and the demo agent image)
runs the agent with the launcher beside it, and a conversation through the agent's Service remembers
turn 1 in turn 2: the launcher reached the proxy with its kubelet-projected token."""

from __future__ import annotations

import time

import pytest

from tests.e2e.agents import AGENT_READY_SECONDS, agent_pods, deploy_agent, probe_warnings, turn
from tests.e2e.conftest import E2ECluster, Release

pytestmark = pytest.mark.e2e


def test_conversation_through_the_agent_service_remembers_turn_one(
    e2e_cluster: E2ECluster, release: Release, namespace: str
) -> None:
    service_url = deploy_agent(e2e_cluster, namespace)
    (pod,) = agent_pods(e2e_cluster, namespace)
    assert len(pod["spec"]["containers"]) == 2, [c["name"] for c in pod["spec"]["containers"]]

    first = turn(service_url, "e2e-conversation", "Hi, my name is Ada").output
    second = turn(service_url, "e2e-conversation", "What is my name?").output
    stranger = turn(service_url, "another-conversation", "What is my name?").output

    assert "Ada" in first
    assert second == "Your name is Ada."
    assert "Ada" not in stranger


def test_a_cold_pod_after_scale_to_zero_recalls_the_conversation(
    e2e_cluster: E2ECluster, release: Release, namespace: str
) -> None:
    service_url = deploy_agent(e2e_cluster, namespace)
    turn(service_url, "e2e-cold", "Hi, my name is Grace")
    (warm_pod,) = agent_pods(e2e_cluster, namespace)

    e2e_cluster.kubectl("scale", "deployment/support-agent", "-n", namespace, "--replicas=0")
    deadline = time.monotonic() + AGENT_READY_SECONDS
    while agent_pods(e2e_cluster, namespace):
        assert time.monotonic() < deadline, "the agent's pods did not go away after scaling to zero"
        time.sleep(0.5)
    e2e_cluster.kubectl("scale", "deployment/support-agent", "-n", namespace, "--replicas=1")
    e2e_cluster.kubectl(
        *("rollout", "status", "deployment/support-agent", "-n", namespace, f"--timeout={AGENT_READY_SECONDS}s"),
        timeout=AGENT_READY_SECONDS + 10,
    )
    (cold_pod,) = agent_pods(e2e_cluster, namespace)

    assert cold_pod["metadata"]["uid"] != warm_pod["metadata"]["uid"]
    assert turn(service_url, "e2e-cold", "What is my name?").output == "Your name is Grace."
    # Neither start left a failed readiness probe behind (issue #37: 1-2 Warning Events per pod start).
    assert probe_warnings(e2e_cluster, namespace) == []
