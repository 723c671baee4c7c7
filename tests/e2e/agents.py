"""Agents in the e2e cluster: apply an AgentDeployment with the demo agent image, wait until it is Ready,
and hold a conversation with it as a client (or a BFF) would: through its Service (``executionModel:
deployment``), or through the Knative ingress by the route's host (``serving``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from sessionmem_core import api, kube
from tests.e2e.conftest import E2ECluster

AGENT_READY_SECONDS = 180
LAUNCHER_CONTAINER = "sessionmem-launcher"  # sessionmem_operator.wiring's name (tests import no component)
SEED_AGENT = "support-agent"
DEPLOYMENT = "deployment"
SERVING = "serving"  # a Knative Service: the seed's own execution model
TURN_SECONDS = 30.0


@dataclass(frozen=True)
class Endpoint:
    """Where a client sends an agent's turns: ``url``, with ``host`` as the Host header when set (the
    Knative ingress routes by host)."""

    url: str
    host: str | None = None


def agent_manifest(
    namespace: str,
    image: str,
    name: str = SEED_AGENT,
    memory: dict[str, Any] | None = None,
    execution_model: str = DEPLOYMENT,
) -> str:
    """DESIGN.md section 1's manifest, with the local demo image; ``memory`` replaces its
    ``sessionMemory``, and the execution model is the Knative-free one unless asked."""
    session_memory = {"scope": "session"} if memory is None else memory
    return json.dumps(
        {
            "apiVersion": kube.API_VERSION,
            "kind": kube.AGENT_KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"image": image, "executionModel": execution_model, "sessionMemory": session_memory},
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


def knative_endpoint(cluster: E2ECluster, namespace: str, name: str = SEED_AGENT) -> Endpoint:
    """The agent's Knative route as an outside client reaches it: the ingress, by the route's host."""
    url = cluster.kubectl("get", f"ksvc/{name}", "-n", namespace, "-o", "jsonpath={.status.url}")
    host = urlsplit(url).hostname
    assert host, f"the Knative Service {namespace}/{name} has no URL yet"
    return Endpoint(f"{cluster.knative().ingress}/", host)


def deploy_agent(
    cluster: E2ECluster,
    namespace: str,
    name: str = SEED_AGENT,
    memory: dict[str, Any] | None = None,
    execution_model: str = DEPLOYMENT,
) -> Endpoint:
    """Applies the AgentDeployment, waits for it to be Ready; returns where its turns go."""
    manifest = agent_manifest(namespace, cluster.demo_agent_image, name, memory, execution_model)
    cluster.kubectl("apply", "-f", "-", stdin=manifest)
    wait_agent_ready(cluster, namespace, name)
    if execution_model == SERVING:
        return knative_endpoint(cluster, namespace, name)
    return Endpoint(service_url(cluster, namespace, name))


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


def wait_revision_wired(cluster: E2ECluster, namespace: str, name: str, variable: str, value: str) -> None:
    """The Knative counterpart of ``wait_pods_wired``: waits until the Service's latest revision is ready,
    takes all of the route's traffic and has ``variable=value`` in its launcher's env (an earlier
    revision's pods may linger until the autoscaler removes them, but the route no longer reaches them)."""
    deadline = time.monotonic() + AGENT_READY_SECONDS
    while True:
        status = json.loads(cluster.kubectl("get", f"ksvc/{name}", "-n", namespace, "-o", "json")).get("status", {})
        latest = status.get("latestReadyRevisionName")
        traffic = {target.get("revisionName") for target in status.get("traffic", [])}
        if latest and latest == status.get("latestCreatedRevisionName") and traffic == {latest}:
            revision = json.loads(
                cluster.kubectl("get", f"revisions.serving.knative.dev/{latest}", "-n", namespace, "-o", "json")
            )
            if any(
                container["name"] == LAUNCHER_CONTAINER
                and {"name": variable, "value": value} in container.get("env", [])
                for container in revision["spec"]["containers"]
            ):
                return
        assert time.monotonic() < deadline, f"the route of {namespace}/{name} is not wired with {variable}={value}"
        time.sleep(0.5)


def wait_wired(
    cluster: E2ECluster, namespace: str, name: str, variable: str, value: str, execution_model: str = DEPLOYMENT
) -> None:
    """Waits until every turn to the agent reaches a pod whose launcher has ``variable=value``."""
    if execution_model == SERVING:
        wait_revision_wired(cluster, namespace, name, variable, value)
    else:
        wait_pods_wired(cluster, namespace, name, variable, value)


@dataclass(frozen=True)
class Turn:
    output: str
    memory: str | None  # the managed loop's X-Sessionmem-Memory: ok | unavailable | not-stored


def turn(
    endpoint: Endpoint,
    conversation_id: str,
    text: str,
    headers: dict[str, str] | None = None,
    timeout: float = TURN_SECONDS,
) -> Turn:
    """One managed-loop turn through the agent's Service or route; retried while the Service's endpoint is
    being programmed (a refused or reset connection: no turn was taken). The agent must answer 200."""
    deadline = time.monotonic() + 30
    sent = {api.CONVERSATION_ID_HEADER: conversation_id, **(headers or {})}
    if endpoint.host is not None:
        sent["Host"] = endpoint.host
    while True:
        try:
            response = httpx.post(endpoint.url, json={"input": text}, headers=sent, timeout=timeout)
            break
        except (httpx.ConnectError, httpx.RemoteProtocolError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert response.status_code == 200, response.text
    return Turn(str(response.json()["output"]), response.headers.get(api.MEMORY_STATUS_HEADER))


def probe_warnings(cluster: E2ECluster, namespace: str, pod: str | None = None) -> list[str]:
    """The Warning Events of failed probes (reason Unhealthy) on the namespace's pods (or on `pod`): a pod
    start should leave none (the launcher's readiness waits for its agent rather than failing)."""
    selector = "type=Warning,reason=Unhealthy" + (f",involvedObject.name={pod}" if pod else "")
    listing = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", selector, "-o", "json")
    return [
        f"{e['involvedObject']['name']} ({e['involvedObject'].get('fieldPath')}, {e.get('lastTimestamp')}): "
        f"{e['message']}"
        for e in json.loads(listing)["items"]
    ]
