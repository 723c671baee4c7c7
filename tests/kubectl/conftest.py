"""A world for ``kubectl sessionmem``: the real kube-apiserver (tests/harness) with RBAC users, the real proxy
process in Kubernetes identity mode on a real valkey-server, an AgentDeployment with memory, and stored
conversations written by the agent itself (a pod-bound token, as the proxy requires)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from sessionmem_client.kubectl.cli import run
from sessionmem_core import api, env, kube
from sessionmem_core.capability import mint_capability, new_key
from sessionmem_core.keys import Owner
from tests.harness.apiserver import KubeTestCluster
from tests.support.kube_tokens import agent_pod_token
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess, free_port

AUDIENCE = "sessionmem-proxy"
AGENT = "support-agent"
END_USER = "end-user-7"
# (conversation, exchanges) the agent stores; the end user's conversation goes to their bucket.
TURNS = {
    "c1": [("user", "My order 1234 never arrived."), ("assistant", "Sorry! Let me check order 1234.")],
    "c2": [("user", "What are your opening hours?"), ("assistant", "We are open 9 to 5.")],
}
USER_TURNS = {"u1": [("user", "Remember my size is M."), ("assistant", "Noted: size M.")]}


def _role(namespace: str, name: str, rules: list[dict[str, Any]], subject: str) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": namespace}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": namespace}]},
    ]  # fmt: skip


def _proxy_rbac(namespace: str) -> list[dict[str, Any]]:
    """What the chart grants the proxy: TokenReview and SubjectAccessReview, reading agents and registries."""
    subject = [{"kind": "ServiceAccount", "name": "sessionmem-proxy", "namespace": namespace}]
    reader = f"{namespace}-proxy-reader"
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{namespace}-proxy-auth-delegator"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
         "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": reader},
         "rules": [{"apiGroups": [kube.GROUP], "resources": [kube.AGENT_PLURAL, kube.REGISTRY_PLURAL],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": reader},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
         "subjects": subject},
    ]  # fmt: skip


_READ_AGENTS = {"apiGroups": [kube.GROUP], "resources": [kube.AGENT_PLURAL], "verbs": ["get", "list"]}
_MEMORY = f"{kube.AGENT_PLURAL}/memory"


def _memory(*verbs: str) -> dict[str, Any]:
    return {"apiGroups": [kube.GROUP], "resources": [_MEMORY], "verbs": list(verbs)}


PEOPLE = {
    # May read and erase the memory of the namespace's agents.
    "alice-admin": [_READ_AGENTS, _memory("get", "list", "delete")],
    # May read it, not erase it.
    "bob-reader": [_READ_AGENTS, _memory("get", "list")],
    # May see the AgentDeployments, not their memory.
    "carol-viewer": [_READ_AGENTS],
}  # fmt: skip


@dataclass
class Result:
    code: int
    out: str
    err: str
    raw: bytes


@dataclass
class MemoryWorld:
    cluster: KubeTestCluster
    namespace: str
    valkey: ValkeyProcess
    proxy: ServiceProcess
    kubeconfigs: dict[str, Path]

    def prefix(self) -> str:
        return f"mem:{self.namespace}/{AGENT}:"

    def stored_keys(self) -> set[str]:
        return {k.decode() for k in self.valkey.client().keys(self.prefix() + "*")}

    def person(self, name: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{name}"

    def kubectl(self, person: str, *args: str) -> Result:
        """``kubectl sessionmem`` as ``person``: its main, in this process, with their kubeconfig file."""
        out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
        err = io.StringIO()
        argv = [*args, "-n", self.namespace, "--kubeconfig", str(self.kubeconfigs[person])]
        code = run([*argv, "--proxy-url", self.proxy.base_url], stdout=out, stderr=err)
        out.flush()
        raw = out.buffer.getvalue()
        return Result(code, raw.decode(), err.getvalue(), raw)


def _store(proxy: ServiceProcess, token: str, conversations: dict[str, list[tuple[str, str]]], **headers: str) -> None:
    with httpx.Client(base_url=proxy.base_url, headers={"Authorization": f"Bearer {token}", **headers}) as client:
        for conversation, turns in conversations.items():
            for role, content in turns:
                body = {"entries": [{"role": role, "content": content}]}
                response = client.post(api.entries_path(conversation), json=body)
                assert response.status_code == 200, response.text


@pytest.fixture
def world(
    kube_cluster: KubeTestCluster, kube_namespace: str, valkey_server: ValkeyProcess, tmp_path: Path
) -> Iterator[MemoryWorld]:
    cluster, ns = kube_cluster, kube_namespace
    cluster.create_service_account(ns, "sessionmem-proxy")
    cluster.apply_manifests(_proxy_rbac(ns))
    kubeconfigs: dict[str, Path] = {}
    for person, rules in PEOPLE.items():
        cluster.create_service_account(ns, person)
        cluster.apply_manifests(_role(ns, person, rules, person))
        token = cluster.mint_service_account_token(ns, person, cluster.issuer)
        kubeconfigs[person] = cluster.write_kubeconfig(tmp_path / f"{person}.kubeconfig", token=token, user=person)
    cluster.apply_manifests(
        [{"apiVersion": kube.API_VERSION, "kind": kube.AGENT_KIND, "metadata": {"name": AGENT, "namespace": ns},
          "spec": {"image": "agent:1", "executionModel": "deployment", "sessionMemory": {"scope": "session"}}}]
    )  # fmt: skip
    # What the operator would write once the agent is wired.
    status = {"scope": "session", "keyPrefix": f"mem:{ns}/{AGENT}:",
              "conditions": [{"type": "MemoryReady", "status": "True", "reason": "Wired",
                              "message": "session scope", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}  # fmt: skip
    path = f"/apis/{kube.API_VERSION}/namespaces/{quote(ns)}/{kube.AGENT_PLURAL}/{AGENT}/status"
    cluster.rest.request("PATCH", path, body={"status": status}, content_type="application/merge-patch+json")

    proxy_token = tmp_path / "proxy-token"
    proxy_token.write_text(cluster.mint_service_account_token(ns, "sessionmem-proxy", cluster.issuer))
    key = new_key()
    (tmp_path / "capability-key").write_bytes(key)
    port = free_port()
    proxy = ServiceProcess(
        "sessionmem_proxy",
        {
            env.VALKEY_URL: valkey_server.url,
            env.PROXY_HOST: "127.0.0.1",
            env.PROXY_PORT: str(port),
            env.AUDIENCE: AUDIENCE,
            env.KUBE_API_SERVER: cluster.server_url,
            env.KUBE_CA_FILE: str(cluster.ca_path),
            env.KUBE_TOKEN_FILE: str(proxy_token),
            env.CAPABILITY_KEY_FILE: str(tmp_path / "capability-key"),
        },
        port,
    )
    proxy.start()
    try:
        agent_token = agent_pod_token(cluster, ns, kube.agent_service_account(AGENT), AUDIENCE)
        _store(proxy, agent_token, TURNS)
        capability = mint_capability(key, END_USER, Owner(ns, AGENT), 600)
        _store(proxy, agent_token, USER_TURNS, **{api.USER_CAPABILITY_HEADER: capability})
        yield MemoryWorld(cluster, ns, valkey_server, proxy, kubeconfigs)
    finally:
        proxy.stop()
