"""Issue #35: the seed's own execution model on a real Knative Serving (the release's controller,
activator, autoscaler, webhook and queue-proxy; tools/e2e/cluster.sh installs them, with kingress as the
networking layer). Knative's webhook accepts what the operator renders; the agent answers through the
ingress by the route's host, behind queue-proxy; the autoscaler itself scales it to zero and the next turn
wakes a cold pod through the activator, whose first memory read returns the stored context; turning
memory off and on rolls a revision each time."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.e2e.agents import (
    AGENT_READY_SECONDS,
    LAUNCHER_CONTAINER,
    SEED_AGENT,
    SERVING,
    agent_pods,
    deploy_agent,
    probe_warnings,
    turn,
)
from tests.e2e.conftest import E2ECluster, OtlpReceiver, Release

pytestmark = pytest.mark.e2e

KNATIVE_NAMESPACE = "knative-serving"
QUEUE_PROXY = "queue-proxy"
AGENT_CONTAINER = "agent"  # sessionmem_operator.render's name (tests import no component)
# The autoscaler's shortest windows (Knative refuses a stable window under 6 s): with them a revision
# nobody calls is scaled to zero ~15 s after its last request instead of ~90 s.
QUICK_AUTOSCALER = {"stable-window": "6s", "scale-to-zero-grace-period": "6s"}
SCALE_TO_ZERO_SECONDS = 180
COLD_TURN_SECONDS = 120.0
LAUNCHER_SPANS = "sessionmem-launcher"  # the launcher's OTel service name


def _json(cluster: E2ECluster, *args: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(cluster.kubectl(*args, "-o", "json"))
    return body


def _condition(body: dict[str, Any], kind: str) -> dict[str, Any]:
    found = [c for c in body.get("status", {}).get("conditions", []) if c["type"] == kind]
    assert len(found) == 1, body.get("status")
    condition: dict[str, Any] = found[0]
    return condition


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_knatives_webhook_accepts_the_seed_and_the_agent_remembers_behind_queue_proxy(
    e2e_cluster: E2ECluster, release: Release, namespace: str
) -> None:
    e2e_cluster.knative()
    endpoint = deploy_agent(e2e_cluster, namespace, execution_model=SERVING)
    # MemoryReady follows the backend's health (the operator probes the proxy every 10 s): an earlier test
    # may have just killed and restarted the proxy.
    e2e_cluster.kubectl(
        *("wait", "--for=condition=MemoryReady", f"agentdeployment/{SEED_AGENT}", "-n", namespace, "--timeout=60s"),
        timeout=70,
    )

    agent = _json(e2e_cluster, "get", f"agentdeployment/{SEED_AGENT}", "-n", namespace)
    assert _condition(agent, "Ready")["status"] == "True"
    memory_ready = _condition(agent, "MemoryReady")
    assert (memory_ready["status"], memory_ready["reason"]) == ("True", "Wired"), memory_ready
    service = _json(e2e_cluster, "get", f"ksvc/{SEED_AGENT}", "-n", namespace)
    assert _condition(service, "Ready")["status"] == "True", service["status"]
    revision = service["status"]["latestReadyRevisionName"]
    assert agent["status"]["latestRevision"] == revision
    (pod,) = agent_pods(e2e_cluster, namespace)
    assert pod["metadata"]["labels"]["serving.knative.dev/revision"] == revision
    names = {container["name"] for container in pod["spec"]["containers"]}
    assert names == {LAUNCHER_CONTAINER, AGENT_CONTAINER, QUEUE_PROXY}, names
    # queue-proxy fronts the launcher: it forwards to the one container with a port.
    queue_env = {
        e["name"]: e.get("value") for c in pod["spec"]["containers"] if c["name"] == QUEUE_PROXY for e in c["env"]
    }
    (launcher,) = [c for c in pod["spec"]["containers"] if c["name"] == LAUNCHER_CONTAINER]
    assert queue_env["USER_PORT"] == str(launcher["ports"][0]["containerPort"])

    first = turn(endpoint, "e2e-knative", "Hi, my name is Ada")
    second = turn(endpoint, "e2e-knative", "What is my name?")
    stranger = turn(endpoint, "e2e-knative-other", "What is my name?")

    assert "Ada" in first.output and first.memory == "ok"
    assert second.output == "Your name is Ada."
    assert "Ada" not in stranger.output


def test_knatives_webhook_refuses_what_it_does_not_allow(e2e_cluster: E2ECluster, namespace: str) -> None:
    """The control: the webhook the seed passed is Knative's, checking for real (a reserved port)."""
    e2e_cluster.knative()
    refused = {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": "refused", "namespace": namespace},
        "spec": {
            "template": {
                "spec": {"containers": [{"image": e2e_cluster.demo_agent_image, "ports": [{"containerPort": 8012}]}]}
            }
        },
    }
    with pytest.raises(AssertionError, match="reserved port"):
        e2e_cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(refused))


@pytest.fixture
def quick_scale_to_zero(e2e_cluster: E2ECluster) -> Iterator[None]:
    """config-autoscaler with its shortest windows for the test; Knative's defaults again after it."""
    e2e_cluster.knative()
    patch = json.dumps({"data": QUICK_AUTOSCALER})
    e2e_cluster.kubectl("patch", "configmap/config-autoscaler", "-n", KNATIVE_NAMESPACE, "--type=merge", "-p", patch)
    yield
    removal = json.dumps([{"op": "remove", "path": f"/data/{key}"} for key in QUICK_AUTOSCALER])
    e2e_cluster.kubectl("patch", "configmap/config-autoscaler", "-n", KNATIVE_NAMESPACE, "--type=json", "-p", removal)


def test_the_autoscaler_scales_to_zero_and_a_cold_pod_behind_the_activator_recalls(
    e2e_cluster: E2ECluster,
    release: Release,
    otlp_receiver: OtlpReceiver,
    namespace: str,
    quick_scale_to_zero: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    endpoint = deploy_agent(e2e_cluster, namespace, execution_model=SERVING)
    assert turn(endpoint, "e2e-cold", "Hi, my name is Grace").memory == "ok"
    (warm,) = agent_pods(e2e_cluster, namespace)
    # Its start left no failed readiness probe. (Its scale-down may: queue-proxy fails readiness on purpose
    # while it drains, which is Knative's, not a start's.)
    assert probe_warnings(e2e_cluster, namespace) == []

    # Nothing here scales anything: the autoscaler sees no traffic and takes the revision to zero.
    deadline = time.monotonic() + SCALE_TO_ZERO_SECONDS
    while agent_pods(e2e_cluster, namespace):
        assert time.monotonic() < deadline, "the autoscaler did not scale the idle revision to zero"
        time.sleep(1)
    (autoscaler,) = _json(e2e_cluster, "get", "podautoscalers.autoscaling.internal.knative.dev", "-n", namespace)[
        "items"
    ]
    assert autoscaler["status"].get("desiredScale") == 0, autoscaler["status"]
    # At zero the revision's Service sends to the activator (the ServerlessService's Proxy mode).
    (sks,) = _json(e2e_cluster, "get", "serverlessservices.networking.internal.knative.dev", "-n", namespace)["items"]
    assert sks["spec"]["mode"] == "Proxy", sks["spec"]

    started = time.monotonic()
    sent_at = datetime.now().astimezone()
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    traced = {"traceparent": f"00-{trace_id}-{caller_span}-01"}
    answer = turn(endpoint, "e2e-cold", "What is my name?", traced, timeout=COLD_TURN_SECONDS)
    cold_seconds = time.monotonic() - started

    assert (answer.output, answer.memory) == ("Your name is Grace.", "ok")
    # The cold pod's first memory read (its launcher's first memory.get) returned turn 1, and its span is
    # the caller's child through the ingress, the activator and queue-proxy.
    spans = otlp_receiver.memory_spans(trace_id, {(LAUNCHER_SPANS, "get"), (LAUNCHER_SPANS, "append")})
    first_read = spans[(LAUNCHER_SPANS, "get")]
    assert first_read["parentSpanId"] == caller_span, first_read
    assert first_read["attributes"]["memory.outcome"] == "ok", first_read
    assert int(first_read["attributes"]["memory.entries"]) == 2, first_read  # turn 1's user and assistant
    (cold,) = agent_pods(e2e_cluster, namespace)
    assert cold["metadata"]["uid"] != warm["metadata"]["uid"]
    # Scale-to-zero starts pods all day: no start may leave a failed readiness probe (a Warning) behind.
    assert probe_warnings(e2e_cluster, namespace, cold["metadata"]["name"]) == []
    created = _time(cold["metadata"]["creationTimestamp"])
    assert created >= sent_at.replace(microsecond=0), "the pod that answered was not started by the turn"
    (launcher,) = [s for s in cold["status"]["containerStatuses"] if s["name"] == LAUNCHER_CONTAINER]
    launched = _time(launcher["state"]["running"]["startedAt"])
    # The launcher's share: from its exec to its first memory read (its span's start), by which time it had
    # started, waited for the agent to listen, and taken the turn the activator held.
    first_read_at = datetime.fromtimestamp(int(first_read["startTimeUnixNano"]) / 1e9, tz=launched.tzinfo)
    launcher_seconds = (first_read_at - launched).total_seconds()
    with capsys.disabled():
        print(
            f"\n[knative] cold turn through the activator: {cold_seconds:.1f}s; pod created -> launcher exec "
            f"{(launched - created).total_seconds():.0f}s, launcher exec -> its first memory read "
            f"{launcher_seconds:.1f}s ({launcher_seconds / cold_seconds:.0%} of the turn; the API's startedAt is "
            "whole seconds, so this can read up to 1s long)"
        )


def _service(cluster: E2ECluster, namespace: str) -> dict[str, Any]:
    return _json(cluster, "get", f"ksvc/{SEED_AGENT}", "-n", namespace)


def _rolled(cluster: E2ECluster, namespace: str, before: str) -> str:
    """Waits until a revision other than ``before`` is the Service's latest and ready, and the
    AgentDeployment's Ready is True again for its current generation; returns that revision."""
    deadline = time.monotonic() + AGENT_READY_SECONDS
    while True:
        status = _service(cluster, namespace).get("status", {})
        latest = status.get("latestReadyRevisionName")
        agent = _json(cluster, "get", f"agentdeployment/{SEED_AGENT}", "-n", namespace)
        if (
            latest not in (None, before)
            and latest == status.get("latestCreatedRevisionName")
            and agent["status"].get("observedGeneration") == agent["metadata"]["generation"]
            and agent["status"].get("latestRevision") == latest
            and _condition(agent, "Ready")["status"] == "True"
        ):
            return str(latest)
        assert time.monotonic() < deadline, f"no new ready revision after {before}: {status}, {agent['status']}"
        time.sleep(1)


def _revision_containers(cluster: E2ECluster, namespace: str, revision: str) -> set[str]:
    body = _json(cluster, "get", f"revisions.serving.knative.dev/{revision}", "-n", namespace)
    return {container["name"] for container in body["spec"]["containers"]}


def test_turning_memory_off_and_on_rolls_a_revision_each_time(
    e2e_cluster: E2ECluster, release: Release, namespace: str
) -> None:
    endpoint = deploy_agent(e2e_cluster, namespace, execution_model=SERVING)
    first = _service(e2e_cluster, namespace)["status"]["latestReadyRevisionName"]
    assert LAUNCHER_CONTAINER in _revision_containers(e2e_cluster, namespace, first)

    off = json.dumps([{"op": "remove", "path": "/spec/sessionMemory"}])
    e2e_cluster.kubectl("patch", f"agentdeployment/{SEED_AGENT}", "-n", namespace, "--type=json", "-p", off)
    second = _rolled(e2e_cluster, namespace, first)
    assert _revision_containers(e2e_cluster, namespace, second) == {AGENT_CONTAINER}
    agent = _json(e2e_cluster, "get", f"agentdeployment/{SEED_AGENT}", "-n", namespace)
    assert _condition(agent, "MemoryReady")["reason"] == "Disabled"

    on = json.dumps({"spec": {"sessionMemory": {"scope": "session"}}})
    e2e_cluster.kubectl("patch", f"agentdeployment/{SEED_AGENT}", "-n", namespace, "--type=merge", "-p", on)
    third = _rolled(e2e_cluster, namespace, second)
    assert third != first
    assert _revision_containers(e2e_cluster, namespace, third) == {LAUNCHER_CONTAINER, AGENT_CONTAINER}
    agent = _json(e2e_cluster, "get", f"agentdeployment/{SEED_AGENT}", "-n", namespace)
    assert _condition(agent, "MemoryReady")["status"] == "True"
    assert turn(endpoint, "e2e-rolled", "Hi, my name is Margaret").memory == "ok"
    assert turn(endpoint, "e2e-rolled", "What is my name?").output == "Your name is Margaret."
