"""The proxy's real authentication against a real kube-apiserver: projected-style tokens minted with the
TokenRequest API, verified by TokenReview under the proxy's audience, and isolation that follows."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from sessionmem_core import env, kube
from sessionmem_core.capability import mint_capability, new_key
from sessionmem_core.keys import Owner, shared_key
from tests.harness.apiserver import KubeTestCluster
from tests.harness.fixtures import namespace_name_for
from tests.support.kube_tokens import agent_pod_token
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess, free_port

pytestmark = pytest.mark.integration

AUDIENCE = "sessionmem-proxy"


@dataclass
class AuthWorld:
    cluster: KubeTestCluster
    proxy: ServiceProcess
    ns_a: str
    ns_b: str
    capability_key: bytes

    def agent_token(self, namespace: str, agent: str, audience: str = AUDIENCE) -> str:
        # Bound to a pod, as the kubelet's projected token is: the proxy refuses tokens without a pod binding.
        return agent_pod_token(self.cluster, namespace, kube.agent_service_account(agent), audience)

    def headers(self, token: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", **extra}


def _cluster_role(name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}


def _proxy_rbac(namespace: str) -> list[dict[str, Any]]:
    """What the chart grants the proxy: TokenReview (system:auth-delegator), reading registries and agents."""
    subject = [{"kind": "ServiceAccount", "name": "sessionmem-proxy", "namespace": namespace}]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{namespace}-proxy-auth-delegator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:auth-delegator",
            },
            "subjects": subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{namespace}-proxy-registries"},
            "rules": [
                {"apiGroups": [kube.GROUP], "resources": [kube.REGISTRY_PLURAL], "verbs": ["get", "list"]},
                {"apiGroups": [kube.GROUP], "resources": [kube.AGENT_PLURAL], "verbs": ["get", "list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{namespace}-proxy-registries"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{namespace}-proxy-registries",
            },
            "subjects": subject,
        },
    ]


def _start_proxy(
    cluster: KubeTestCluster, valkey: ValkeyProcess, workdir: Path, proxy_token: str, key_file: Path, api: str
) -> ServiceProcess:
    token_file = workdir / "proxy-token"
    token_file.write_text(proxy_token)
    port = free_port()
    proc = ServiceProcess(
        "sessionmem_proxy",
        {
            env.VALKEY_URL: valkey.url,
            env.PROXY_HOST: "127.0.0.1",
            env.PROXY_PORT: str(port),
            env.AUDIENCE: AUDIENCE,
            env.KUBE_API_SERVER: api,
            env.KUBE_CA_FILE: str(cluster.ca_path),
            env.KUBE_TOKEN_FILE: str(token_file),
            env.CAPABILITY_KEY_FILE: str(key_file),
            env.MEMBERSHIP_CACHE_SECONDS: "0.5",
        },
        port,
    )
    proc.start()
    return proc


@pytest.fixture
def world(
    kube_cluster: KubeTestCluster, kube_namespace: str, valkey_server: ValkeyProcess, tmp_path: Path
) -> Iterator[AuthWorld]:
    ns_b = kube_cluster.create_namespace(namespace_name_for("auth-b"))
    kube_cluster.create_service_account(kube_namespace, "sessionmem-proxy")
    kube_cluster.apply_manifests(_proxy_rbac(kube_namespace))
    # The proxy's own credential: audience-bound to the API server, as the in-cluster token would be.
    proxy_token = kube_cluster.mint_service_account_token(kube_namespace, "sessionmem-proxy", kube_cluster.issuer)
    key = new_key()
    (tmp_path / "capability-key").write_bytes(key)
    proxy = _start_proxy(
        kube_cluster, valkey_server, tmp_path, proxy_token, tmp_path / "capability-key", kube_cluster.server_url
    )
    yield AuthWorld(kube_cluster, proxy, kube_namespace, ns_b, key)
    proxy.stop()
    kube_cluster.delete_namespace(ns_b)


def _append(client: httpx.Client, token: str, conversation: str, text: str, **params: str) -> httpx.Response:
    return client.post(
        f"/v1/conversations/{conversation}/entries",
        params=params,
        json={"entries": [{"role": "user", "content": text}]},
        headers={"Authorization": f"Bearer {token}"},
    )


def test_agent_a_can_never_reach_agent_bs_conversations(world: AuthWorld) -> None:
    a = world.agent_token(world.ns_a, "agent-a")
    b_same_ns = world.agent_token(world.ns_a, "agent-b")
    a_other_ns = world.agent_token(world.ns_b, "agent-a")
    with httpx.Client(base_url=world.proxy.base_url, timeout=10) as client:
        assert _append(client, a, "conv-1", "private to agent-a").status_code == 200
        for intruder in (b_same_ns, a_other_ns):
            h = world.headers(intruder)
            assert client.get("/v1/conversations/conv-1/entries", headers=h).json()["entries"] == []
            assert (
                client.get("/v1/conversations/conv-1/search", params={"q": "private"}, headers=h).json()["matches"]
                == []
            )
            assert client.delete("/v1/conversations/conv-1", headers=h).json()["entries"] == 0
            assert _append(client, intruder, "conv-1", "intruder").json()["version"] == 1  # its own key
        mine = client.get("/v1/conversations/conv-1/entries", headers=world.headers(a)).json()
    assert [(e["content"], e["author"]) for e in mine["entries"]] == [("private to agent-a", f"{world.ns_a}/agent-a")]


def _resign(token: str, key: rsa.RSAPrivateKey, **claims: Any) -> str:
    header_b64, payload_b64, _ = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(payload_b64 + "=" * (-len(payload_b64) % 4)))
    payload.update(claims)
    body = header_b64 + "." + base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    signature = key.sign(body.encode(), padding.PKCS1v15(), hashes.SHA256())
    return body + "." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()


def test_bad_tokens_are_401_and_non_agents_403(world: AuthWorld) -> None:
    good = world.agent_token(world.ns_a, "agent-a")
    assert world.cluster.pki is not None
    signing_key = serialization.load_pem_private_key(world.cluster.pki.sa_signing_key.read_bytes(), password=None)
    assert isinstance(signing_key, rsa.RSAPrivateKey)
    now = int(time.time())
    expired = _resign(good, signing_key, iat=now - 1200, nbf=now - 1200, exp=now - 600)
    forged = _resign(good, rsa.generate_private_key(public_exponent=65537, key_size=2048))
    not_an_agent = agent_pod_token(world.cluster, world.ns_a, "build-bot", AUDIENCE)
    not_bound_to_a_pod = world.cluster.mint_service_account_token(
        world.ns_a, kube.agent_service_account("agent-a"), AUDIENCE
    )
    wrong_audience = world.agent_token(world.ns_a, "agent-a", audience="some-other-service")
    with httpx.Client(base_url=world.proxy.base_url, timeout=10) as client:

        def status(token: str | None) -> tuple[int, str]:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            response = client.get("/v1/conversations/c/entries", headers=headers)
            return response.status_code, response.json().get("error", {}).get("type", "")

        assert status(good) == (200, "")
        assert status(None) == (401, "unauthenticated")
        assert status("not-a-jwt") == (401, "unauthenticated")
        assert status(expired) == (401, "unauthenticated")
        assert status(forged) == (401, "unauthenticated")
        assert status(wrong_audience) == (401, "unauthenticated")
        assert status(not_an_agent) == (403, "forbidden")
        assert status(not_bound_to_a_pod) == (401, "unauthenticated")


def test_tokenreview_unavailable_fails_closed_with_503(
    world: AuthWorld, kube_cluster: KubeTestCluster, valkey_server: ValkeyProcess, tmp_path: Path
) -> None:
    token = world.agent_token(world.ns_a, "agent-a")
    dead_api = f"https://127.0.0.1:{free_port()}"
    proxy = _start_proxy(kube_cluster, valkey_server, tmp_path, "unused", tmp_path / "capability-key", dead_api)
    try:
        response = httpx.get(f"{proxy.base_url}/v1/conversations/c/entries", headers=world.headers(token), timeout=10)
    finally:
        proxy.stop()
    assert response.status_code == 503 and response.json()["error"]["type"] == "auth_unavailable"


def test_per_user_buckets_with_real_tokens(world: AuthWorld) -> None:
    token = world.agent_token(world.ns_a, "agent-a")
    owner = Owner(world.ns_a, "agent-a")

    def user(subject: str, key: bytes | None = None, now: float | None = None) -> dict[str, str]:
        capability = mint_capability(key or world.capability_key, subject, owner, 60, now=now)
        return world.headers(token, **{"X-Sessionmem-User-Capability": capability})

    with httpx.Client(base_url=world.proxy.base_url, timeout=10) as client:
        for subject in ("alice", "bob"):
            body = {"entries": [{"role": "user", "content": f"{subject}'s note"}]}
            assert client.post("/v1/conversations/same/entries", json=body, headers=user(subject)).status_code == 200
        seen = {
            s: [e["content"] for e in client.get("/v1/conversations/same/entries", headers=user(s)).json()["entries"]]
            for s in ("alice", "bob")
        }
        forged = client.get("/v1/conversations/same/entries", headers=user("alice", key=new_key()))
        expired = client.get("/v1/conversations/same/entries", headers=user("alice", now=1000))
    assert seen == {"alice": ["alice's note"], "bob": ["bob's note"]}
    assert forged.status_code == 401 and expired.status_code == 401


def test_shared_scope_needs_registry_membership(world: AuthWorld, valkey_server: ValkeyProcess) -> None:
    member_1 = world.agent_token(world.ns_a, "agent-a")
    member_2 = world.agent_token(world.ns_b, "agent-a")
    outsider = world.agent_token(world.ns_a, "agent-b")
    registry = f"team-{world.ns_a}"[:63]
    world.cluster.apply_manifests(
        [
            {
                "apiVersion": kube.API_VERSION,
                "kind": kube.REGISTRY_KIND,
                "metadata": {"name": registry},
                "spec": {
                    "members": [
                        {"namespace": world.ns_a, "name": "agent-a"},
                        {"namespace": world.ns_b, "name": "agent-a"},
                    ]
                },
            }
        ]
    )
    with httpx.Client(base_url=world.proxy.base_url, timeout=10) as client:
        assert _append(client, member_1, "thread", "from one", scope="shared").json()["scope"] == "shared"
        assert _append(client, member_2, "thread", "from two", scope="shared").json()["scope"] == "shared"
        shared = client.get("/v1/conversations/thread/entries?scope=shared", headers=world.headers(member_2)).json()
        outsider_write = _append(client, outsider, "thread", "outsider", scope="shared").json()
        outsider_read = client.get("/v1/conversations/thread/entries?scope=shared", headers=world.headers(outsider))
    assert [(e["content"], e["author"]) for e in shared["entries"]] == [
        ("from one", f"{world.ns_a}/agent-a"),
        ("from two", f"{world.ns_b}/agent-a"),
    ]
    assert outsider_write["scope"] == "session" and outsider_write["version"] == 1
    assert [e["content"] for e in outsider_read.json()["entries"]] == ["outsider"]
    assert valkey_server.client().llen(shared_key(registry, "thread")) == 2


def _per_user_agent(world: AuthWorld, name: str) -> None:
    world.cluster.apply_manifests(
        [
            {
                "apiVersion": kube.API_VERSION,
                "kind": kube.AGENT_KIND,
                "metadata": {"name": name, "namespace": world.ns_a},
                "spec": {"image": "agent:1", "executionModel": "deployment", "sessionMemory": {"perUser": True}},
            }
        ]
    )


def test_the_proxy_enforces_per_user_from_the_agent_deployment(world: AuthWorld) -> None:
    """perUser is the cluster's truth, not the pod's word: the proxy reads it from the AgentDeployment and
    refuses that agent's calls without a user (whatever its launcher says), never a shared bucket."""
    _per_user_agent(world, "per-user-agent")
    token = world.agent_token(world.ns_a, "per-user-agent")
    alice = mint_capability(world.capability_key, "alice", Owner(world.ns_a, "per-user-agent"), 600)
    with httpx.Client(base_url=world.proxy.base_url, timeout=10) as client:
        bare = _append(client, token, "c1", "no user")
        listed = client.get("/v1/conversations", headers=world.headers(token))
        with_user = client.post(
            "/v1/conversations/c1/entries",
            json={"entries": [{"role": "user", "content": "alice's"}]},
            headers=world.headers(token, **{"X-Sessionmem-User-Capability": alice}),
        )
    assert bare.status_code == 401 and bare.json()["error"]["type"] == "user_capability_required"
    assert listed.status_code == 401
    assert with_user.status_code == 200


def test_an_administrator_erases_with_rbac_and_an_agent_cannot(world: AuthWorld, valkey_server: ValkeyProcess) -> None:
    """The RBAC-authorised erase through the real proxy: a person with delete on agentdeployments/memory
    erases the agent's memory and gets a receipt of exactly what left Valkey; a person without it and the
    agent itself are refused, and the agent's own bulk erase is refused too."""
    cluster, ns = world.cluster, world.ns_a
    for person in ("alice-admin", "bob-viewer"):
        cluster.create_service_account(ns, person)
    rule = {"apiGroups": [kube.GROUP], "resources": [f"{kube.AGENT_PLURAL}/memory"], "verbs": ["delete"]}
    cluster.apply_manifests(
        [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "memory-eraser", "namespace": ns}, "rules": [rule]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "memory-eraser", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "memory-eraser"},
             "subjects": [{"kind": "ServiceAccount", "name": "alice-admin", "namespace": ns}]},
        ]
    )  # fmt: skip
    alice = cluster.mint_service_account_token(ns, "alice-admin", cluster.issuer)
    bob = cluster.mint_service_account_token(ns, "bob-viewer", cluster.issuer)
    agent = world.agent_token(ns, "erased-agent")
    other = world.agent_token(ns, "kept-agent")
    path = f"/v1/admin/namespaces/{ns}/agents/erased-agent/memory"
    with httpx.Client(base_url=world.proxy.base_url, timeout=10) as client:
        for conversation in ("a", "b"):
            assert _append(client, agent, conversation, "to be erased").status_code == 200
        assert _append(client, other, "a", "kept").status_code == 200
        before = sorted(k.decode() for k in valkey_server.conversation_keys())
        by_agent_bulk = client.delete("/v1/conversations", params={"confirm": "true"}, headers=world.headers(agent))
        by_agent = client.delete(path, headers=world.headers(agent))
        by_bob = client.delete(path, headers=world.headers(bob))
        by_alice = client.delete(path, headers=world.headers(alice))
    after = sorted(k.decode() for k in valkey_server.conversation_keys())
    assert (by_agent_bulk.status_code, by_agent.status_code, by_bob.status_code) == (403, 403, 403)
    assert "bob-viewer" in by_bob.json()["error"]["message"] and "cannot delete" in by_bob.json()["error"]["message"]
    receipt = by_alice.json()
    assert by_alice.status_code == 200 and receipt["erasedBy"].endswith(":alice-admin")
    assert receipt["entries"] == 2 and receipt["keys"] == sorted(set(before) - set(after))
    assert after == [f"mem:{ns}/kept-agent:a"]
