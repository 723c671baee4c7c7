"""Issue #19, step 5's second half: Valkey keeps conversations on its PersistentVolume (a hostPath volume
of the e2e cluster), so a Valkey pod that goes away loses nothing it acknowledged."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.agents import Turn, deploy_agent, turn
from tests.e2e.conftest import ROLLOUT_SECONDS, E2ECluster, Release, release_workloads

pytestmark = pytest.mark.e2e

RECOVERY_SECONDS = 90


def recall(url: str, conversation_id: str) -> Turn:
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
    e2e_cluster.kubectl("delete", "pod", f"{statefulset}-0", "-n", release.namespace, "--wait=true", timeout=120)
    rolled_out(e2e_cluster, release, "valkey")
    new_pod = e2e_cluster.kubectl(
        "get", f"pod/{statefulset}-0", "-n", release.namespace, "-o", "jsonpath={.metadata.uid}"
    )

    assert new_pod != old_pod
    assert recall(url, "e2e-persisted").output == "Your name is Linus."
