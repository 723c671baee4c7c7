"""Issue #19, step 4: the scopes of DESIGN.md sections 3-5 on a real cluster. Two members of an
AgentRegistry share one conversation under `mem:shared:{registry}:`, each message stamped with its writer;
a perUser agent keeps each end user in a bucket of their own, from a capability signed with the chart's
key; an agent asking for `shared` that no registry lists keeps its private layout and says so (the
MemoryReady condition and a Warning Event). Keys are read from Valkey itself, as the proxy's ACL user."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from sessionmem_core import api, env, kube
from sessionmem_core.capability import Keyring, mint_capability, user_bucket
from sessionmem_core.keys import Owner
from tests.e2e.agents import DEPLOYMENT, SERVING, deploy_agent, turn, wait_wired
from tests.e2e.conftest import E2ECluster, Release, release_workloads, valkey_cli

pytestmark = pytest.mark.e2e

MEMBERSHIP_CACHE_SECONDS = 10.0  # the chart's proxy.membershipCacheSeconds


def _keys(cluster: E2ECluster, release: Release, pattern: str) -> set[str]:
    return set(valkey_cli(cluster, release, "--scan", "--pattern", pattern))


def _agent(cluster: E2ECluster, namespace: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(cluster.kubectl("get", f"agentdeployment/{name}", "-n", namespace, "-o", "json"))
    return body


def _condition(body: dict[str, Any], kind: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in body["status"]["conditions"] if c["type"] == kind]
    assert len(found) == 1, body["status"]
    return found[0]


def _warnings(cluster: E2ECluster, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={name},reason={reason},type=Warning"
    listing = cluster.kubectl("get", "events", "-n", namespace, "-o", "json", f"--field-selector={selector}")
    events: list[dict[str, Any]] = json.loads(listing)["items"]
    return events


@dataclass(frozen=True)
class Registry:
    name: str
    created: float  # time.monotonic() when it was applied


@pytest.fixture
def registry(e2e_cluster: E2ECluster, namespace: str) -> Iterator[Registry]:
    """An AgentRegistry (cluster-scoped, so named after the test's namespace) listing writer and reader."""
    name = f"team-{namespace}"
    manifest = {
        "apiVersion": kube.API_VERSION,
        "kind": kube.REGISTRY_KIND,
        "metadata": {"name": name},
        "spec": {"members": [{"namespace": namespace, "name": agent} for agent in ("writer", "reader")]},
    }
    e2e_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    yield Registry(name, time.monotonic())
    e2e_cluster.kubectl("delete", "agentregistry", name, "--wait=false")


# Both execution models: a Deployment, and the seed's Knative Service (issue #35).
EXECUTION_MODELS = pytest.mark.parametrize("execution_model", [DEPLOYMENT, SERVING])


@EXECUTION_MODELS
def test_registry_members_share_one_conversation_stamped_with_each_writer(
    e2e_cluster: E2ECluster, release: Release, namespace: str, registry: Registry, execution_model: str
) -> None:
    writer = deploy_agent(e2e_cluster, namespace, "writer", {"scope": "shared"}, execution_model)
    reader = deploy_agent(e2e_cluster, namespace, "reader", {"scope": "shared"}, execution_model)
    for agent in ("writer", "reader"):
        wait_wired(e2e_cluster, namespace, agent, env.SCOPE, "shared", execution_model)
    # The proxy may hold a list of registries fetched before this one existed, for its cache period.
    time.sleep(max(0.0, registry.created + MEMBERSHIP_CACHE_SECONDS - time.monotonic()))

    assert turn(writer, "e2e-shared", "Hi, my name is Hedy").memory == "ok"
    recalled = turn(reader, "e2e-shared", "What is my name?")

    assert recalled.output == "Your name is Hedy." and recalled.memory == "ok"
    shared_key = f"mem:shared:{registry.name}:e2e-shared"
    assert _keys(e2e_cluster, release, f"mem:shared:{registry.name}:*") == {shared_key}
    assert _keys(e2e_cluster, release, f"mem:{namespace}/*") == set()
    entries = [json.loads(line) for line in valkey_cli(e2e_cluster, release, "LRANGE", shared_key, "0", "-1")]
    assert [(e["role"], e["author"]) for e in entries] == [
        ("user", f"{namespace}/writer"),
        ("assistant", f"{namespace}/writer"),
        ("user", f"{namespace}/reader"),
        ("assistant", f"{namespace}/reader"),
    ]
    for agent in ("writer", "reader"):
        body = _agent(e2e_cluster, namespace, agent)
        memory_ready = _condition(body, "MemoryReady")
        assert (memory_ready["status"], memory_ready["reason"]) == ("True", "Wired"), memory_ready
        assert (body["status"]["scope"], body["status"]["registry"]) == ("shared", registry.name)
        assert body["status"]["keyPrefix"] == f"mem:shared:{registry.name}:"


def test_a_non_member_asking_for_shared_keeps_its_private_keys_and_says_so(
    e2e_cluster: E2ECluster, release: Release, namespace: str
) -> None:
    loner = deploy_agent(e2e_cluster, namespace, "loner", {"scope": "shared"})

    assert turn(loner, "e2e-alone", "Hi, my name is Joan").memory == "ok"
    assert turn(loner, "e2e-alone", "What is my name?").output == "Your name is Joan."

    assert _keys(e2e_cluster, release, f"mem:{namespace}/loner:*") == {f"mem:{namespace}/loner:e2e-alone"}
    assert _keys(e2e_cluster, release, "mem:shared:*:e2e-alone") == set()
    body = _agent(e2e_cluster, namespace, "loner")
    memory_ready = _condition(body, "MemoryReady")
    assert (memory_ready["status"], memory_ready["reason"]) == ("False", "NotARegistryMember"), memory_ready
    assert "no AgentRegistry lists" in memory_ready["message"]
    assert (body["status"]["scope"], body["status"]["keyPrefix"]) == ("session", f"mem:{namespace}/loner:")
    assert _condition(body, "Ready")["status"] == "True"  # the agent runs, with its private memory
    deadline = time.monotonic() + 30
    while not (events := _warnings(e2e_cluster, namespace, "loner", "NotARegistryMember")):
        assert time.monotonic() < deadline, "no NotARegistryMember Event"
        time.sleep(0.5)
    assert events[0]["involvedObject"]["kind"] == kube.AGENT_KIND


@EXECUTION_MODELS
def test_a_per_user_agent_keeps_each_user_in_a_bucket_of_their_own(
    e2e_cluster: E2ECluster, release: Release, namespace: str, execution_model: str
) -> None:
    personal = deploy_agent(e2e_cluster, namespace, "personal", {"scope": "session", "perUser": True}, execution_model)
    secret = release_workloads(e2e_cluster, release)["proxy"].split("/", 1)[1] + "-capability-key"
    encoded = e2e_cluster.kubectl(
        "get", f"secret/{secret}", "-n", release.namespace, "-o", "jsonpath={.data.capability-key}"
    )
    key = base64.b64decode(encoded).strip()
    agent = Owner(namespace, "personal")

    def as_user(subject: str) -> dict[str, str]:
        return {api.USER_CAPABILITY_HEADER: mint_capability(key, subject, agent, ttl_seconds=300)}

    assert turn(personal, "e2e-user", "Hi, my name is Alice", as_user("alice")).memory == "ok"
    alice = turn(personal, "e2e-user", "What is my name?", as_user("alice"))
    bob = turn(personal, "e2e-user", "What is my name?", as_user("bob"))

    assert alice.output == "Your name is Alice."
    assert bob.output == "I don't know your name yet." and bob.memory == "ok"
    keyring = Keyring.single(key)  # the chart mounts one key: it signs and derives the buckets
    buckets = {user_bucket(keyring, agent, subject) for subject in ("alice", "bob")}
    assert _keys(e2e_cluster, release, f"mem:{namespace}/personal:*") == {
        f"mem:{namespace}/personal:u:{bucket}:e2e-user" for bucket in buckets
    }
    # No capability, no memory: the turn is answered, and nothing is read or stored for anyone.
    anonymous = turn(personal, f"e2e-{uuid.uuid4().hex[:6]}", "What is my name?")
    assert anonymous.output == "I don't know your name yet." and anonymous.memory == "unavailable"
