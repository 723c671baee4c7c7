"""Agents in the e2e cluster: apply an AgentDeployment with the demo agent image, wait until it is Ready,
and hold a conversation with it through its Service, as a client (or a BFF) would."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from sessionmem_core import api, kube
from tests.e2e.conftest import E2ECluster

AGENT_READY_SECONDS = 180
LAUNCHER_CONTAINER = "sessionmem-launcher"  # sessionmem_operator.wiring's name (tests import no component)
SEED_AGENT = "support-agent"


def agent_manifest(namespace: str, image: str, name: str = SEED_AGENT, memory: dict[str, Any] | None = None) -> str:
    """DESIGN.md section 1's manifest, with the local demo image and the Knative-free execution model;
    ``memory`` replaces its ``sessionMemory``."""
    session_memory = {"scope": "session"} if memory is None else memory
    return json.dumps(
        {
            "apiVersion": kube.API_VERSION,
            "kind": kube.AGENT_KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"image": image, "executionModel": "deployment", "sessionMemory": session_memory},
        }
    )


def wait_agent_ready(cluster: E2ECluster, namespace: str, name: str = SEED_AGENT) -> None:
    cluster.kubectl(
        *("wait", "--for=condition=Ready", f"agentdeployment/{name}", "-n", namespace),
        f"--timeout={AGENT_READY_SECONDS}s",
        timeout=AGENT_READY_SECONDS + 10,
    )


def service_url(cluster: E2ECluster, namespace: str, name: str = SEED_AGENT) -> str:
    cluster_ip = cluster.kubectl("get", f"service/{name}", "-n", namespace, "-o", "jsonpath={.spec.clusterIP}")
    return f"http://{cluster_ip}/"


def deploy_agent(
    cluster: E2ECluster, namespace: str, name: str = SEED_AGENT, memory: dict[str, Any] | None = None
) -> str:
    """Applies the AgentDeployment, waits for it to be Ready; returns its Service's URL."""
    cluster.kubectl("apply", "-f", "-", stdin=agent_manifest(namespace, cluster.demo_agent_image, name, memory))
    wait_agent_ready(cluster, namespace, name)
    return service_url(cluster, namespace, name)


def agent_pods(cluster: E2ECluster, namespace: str, name: str = SEED_AGENT) -> list[dict[str, Any]]:
    listing = cluster.kubectl("get", "pods", "-n", namespace, "-l", f"{kube.LABEL_AGENT}={name}", "-o", "json")
    pods: list[dict[str, Any]] = json.loads(listing)["items"]
    return pods


def wait_pods_wired(cluster: E2ECluster, namespace: str, name: str, variable: str, value: str) -> None:
    """Waits until every pod of the agent, terminating ones too, has ``variable=value`` in its launcher's
    env and is Ready: a turn through the Service can then reach no pod of an earlier wiring (the operator
    may roll a second revision when it learns of a change, e.g. an AgentRegistry, after the first)."""
    deadline = time.monotonic() + AGENT_READY_SECONDS
    while True:
        pods = agent_pods(cluster, namespace, name)
        wired = [
            pod
            for pod in pods
            for container in pod["spec"]["containers"]
            if container["name"] == LAUNCHER_CONTAINER
            and {"name": variable, "value": value} in container.get("env", [])
            and any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
        ]
        if pods and len(wired) == len(pods):
            return
        assert time.monotonic() < deadline, f"pods of {namespace}/{name} not wired with {variable}={value}"
        time.sleep(0.5)


@dataclass(frozen=True)
class Turn:
    output: str
    memory: str | None  # the managed loop's X-Sessionmem-Memory: ok | unavailable | not-stored


def turn(url: str, conversation_id: str, text: str, headers: dict[str, str] | None = None) -> Turn:
    """One managed-loop turn through the agent's Service; retried while the Service's endpoint is being
    programmed (a refused or reset connection: no turn was taken). The agent must answer 200."""
    deadline = time.monotonic() + 30
    while True:
        try:
            response = httpx.post(
                url,
                json={"input": text},
                headers={api.CONVERSATION_ID_HEADER: conversation_id, **(headers or {})},
                timeout=30,
            )
            break
        except (httpx.ConnectError, httpx.RemoteProtocolError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert response.status_code == 200, response.text
    return Turn(str(response.json()["output"]), response.headers.get(api.MEMORY_STATUS_HEADER))
