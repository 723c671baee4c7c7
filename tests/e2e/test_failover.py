"""Issue #19, step 5's second half: Valkey keeps conversations on its PersistentVolume (a hostPath volume
of the e2e cluster), so a Valkey pod that goes away loses nothing it acknowledged; and while the proxy or
Valkey is gone, turns still get the agent's answer, without memory (fail-open), promptly."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.e2e.agents import Endpoint, Turn, deploy_agent, turn
from tests.e2e.conftest import (
    ROLLOUT_SECONDS,
    E2ECluster,
    Release,
    delete_pod,
    release_workloads,
    valkey_cli,
)

pytestmark = pytest.mark.e2e

RECOVERY_SECONDS = 90
OUTAGE_TURNS = 5


def recall(url: Endpoint, conversation_id: str) -> Turn:
    """Asks the agent for the name it was told, until the managed loop's replay reads memory again (a turn
    answered without memory is fail-open, and stores nothing a later recall would see)."""
    deadline = time.monotonic() + RECOVERY_SECONDS
    while True:
        answer = turn(url, conversation_id, "What is my name?")
        if answer.memory != "unavailable":
            return answer
        assert time.monotonic() < deadline, "memory did not come back"
        time.sleep(1)


def rolled_out(cluster: E2ECluster, release: Release, component: str) -> None:
    workload = release_workloads(cluster, release)[component]
    cluster.kubectl(
        *("rollout", "status", workload, "-n", release.namespace, f"--timeout={ROLLOUT_SECONDS}s"),
        timeout=ROLLOUT_SECONDS + 10,
    )


def test_valkey_keeps_conversations_on_its_volume_across_a_restart(
    e2e_cluster: E2ECluster, release: Release, namespace: str
) -> None:
    (claim,) = json.loads(
        e2e_cluster.kubectl(
            *("get", "persistentvolumeclaims", "-n", release.namespace),
            *("-l", "app.kubernetes.io/component=valkey", "-o", "json"),
        )
    )["items"]
    assert claim["status"]["phase"] == "Bound", claim["status"]
    volume = json.loads(e2e_cluster.kubectl("get", "persistentvolume", claim["spec"]["volumeName"], "-o", "json"))
    assert volume["spec"]["hostPath"]["path"] == str(release.valkey_volume)

    url = deploy_agent(e2e_cluster, namespace)
    told = turn(url, "e2e-persisted", "Hi, my name is Linus")
    assert told.memory == "ok"
    assert list((release.valkey_volume / "appendonlydir").glob("*.aof")), "Valkey's AOF is on the volume"

    statefulset = release_workloads(e2e_cluster, release)["valkey"].split("/", 1)[1]
    old_pod = e2e_cluster.kubectl(
        "get", f"pod/{statefulset}-0", "-n", release.namespace, "-o", "jsonpath={.metadata.uid}"
    )
    delete_pod(e2e_cluster, release.namespace, f"{statefulset}-0")
    rolled_out(e2e_cluster, release, "valkey")
    new_pod = e2e_cluster.kubectl(
        "get", f"pod/{statefulset}-0", "-n", release.namespace, "-o", "jsonpath={.metadata.uid}"
    )

    assert new_pod != old_pod
    assert recall(url, "e2e-persisted").output == "Your name is Linus."


NODE = "e2e-node"  # tools/e2e/cluster.sh's one node


@contextmanager
def nothing_scheduled(cluster: E2ECluster) -> Iterator[None]:
    """The node is cordoned for the block: a killed pod's replacement waits, so an outage lasts as long
    as the test needs, not as long as a restart happens to take."""
    cluster.kubectl("cordon", NODE)
    try:
        yield
    finally:
        cluster.kubectl("uncordon", NODE)


def _kill(cluster: E2ECluster, release: Release, component: str) -> None:
    """Kills the component's pods at once (no grace period: SIGKILL), as a crashed node would."""
    selector = f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component={component}"
    cluster.kubectl(
        *("delete", "pods", "-n", release.namespace, "-l", selector),
        *("--grace-period=0", "--force", "--wait=true"),
        timeout=120,
    )


def test_turns_fail_open_while_the_proxy_and_valkey_are_killed_and_nothing_acknowledged_is_lost(
    e2e_cluster: E2ECluster, release: Release, namespace: str
) -> None:
    url = deploy_agent(e2e_cluster, namespace)
    conversation = "e2e-failover"
    said: dict[str, str | None] = {}  # each input and its turn's X-Sessionmem-Memory

    def say(text: str) -> Turn:
        answer = turn(url, conversation, text)  # 200 with the agent's answer, or it fails the test
        said[text] = answer.memory
        return answer

    assert say("Hi, my name is Ada").memory == "ok"
    for component in ("proxy", "valkey"):
        with nothing_scheduled(e2e_cluster):
            _kill(e2e_cluster, release, component)
            # A killed pod's process may outlive its API object for a moment: turns until one is
            # answered without memory. Its replacement cannot be scheduled: from then on every turn is.
            deadline = time.monotonic() + RECOVERY_SECONDS
            while say(f"as the {component} goes, {len(said)}").memory == "ok":
                assert time.monotonic() < deadline, f"the {component} never went away"
            # Then long enough for its address to be gone: connections to it meet silence, not a refusal.
            outage = []
            for n in range(OUTAGE_TURNS):
                time.sleep(1)
                outage.append(say(f"while the {component} is gone, turn {n}"))
        assert [t.memory for t in outage] == ["unavailable"] * OUTAGE_TURNS, outage
        rolled_out(e2e_cluster, release, component)
        assert recall(url, conversation).output == "Your name is Ada."
        assert say(f"after the {component} came back").memory == "ok"

    key = f"mem:{namespace}/support-agent:{conversation}"
    stored = [json.loads(line) for line in valkey_cli(e2e_cluster, release, "LRANGE", key, "0", "-1")]
    stored_inputs = {entry["content"] for entry in stored if entry["role"] == "user"}
    acknowledged = {text for text, memory in said.items() if memory == "ok"}
    assert acknowledged <= stored_inputs, acknowledged - stored_inputs
