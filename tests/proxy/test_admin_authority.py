"""Memory administration is authorised by Kubernetes RBAC on the real API server: TokenReview tells who
the caller is, SubjectAccessReview on ``agentdeployments/memory`` whether they may; an agent's own token
is refused whatever it holds."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from sessionmem_core import kube
from sessionmem_core.errors import AuthUnavailable, Forbidden, Unauthenticated
from sessionmem_infra.serving import Rate
from sessionmem_proxy.kubeapi import KubeAPI
from sessionmem_proxy.rbac import ERASE, READ, KubeAdminAuthorizer
from tests.harness.apiserver import KubeTestCluster

pytestmark = pytest.mark.integration

AGENT_AUDIENCE = "sessionmem-proxy"


def _binding(namespace: str, name: str, role: dict[str, Any], subject: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            **role,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": namespace}],
        },
    ]


@dataclass
class World:
    authorizer: KubeAdminAuthorizer
    namespace: str
    eraser: str
    reader: str
    agent: str
    http: httpx.AsyncClient
    api: KubeAPI


@pytest.fixture
async def world(kube_cluster: KubeTestCluster, kube_namespace: str) -> AsyncIterator[World]:
    ns = kube_namespace
    cluster = kube_cluster
    # The proxy's own credential, with what the chart grants it: TokenReview and SubjectAccessReview.
    cluster.create_service_account(ns, "sessionmem-proxy")
    cluster.apply_manifests(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{ns}-proxy-auth-delegator"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:auth-delegator",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "sessionmem-proxy", "namespace": ns}],
            }
        ]
    )
    proxy_token = cluster.mint_service_account_token(ns, "sessionmem-proxy", cluster.issuer)
    # People: one who may erase the support agent's memory, one who may only read it.
    for person in ("alice-admin", "bob-reader"):
        cluster.create_service_account(ns, person)
    erase_rule = {"apiGroups": [kube.GROUP], "resources": [f"{kube.AGENT_PLURAL}/memory"], "verbs": ["get", "delete"]}
    erase_rule["resourceNames"] = ["support-agent"]
    read_rule = {"apiGroups": [kube.GROUP], "resources": [f"{kube.AGENT_PLURAL}/memory"], "verbs": ["get"]}
    cluster.apply_manifests(_binding(ns, "memory-eraser", {"rules": [erase_rule]}, "alice-admin"))
    cluster.apply_manifests(_binding(ns, "memory-reader", {"rules": [read_rule]}, "bob-reader"))
    # The agent's own ServiceAccount, granted the very same permission: it still must not administer.
    agent_sa = kube.agent_service_account("support-agent")
    cluster.create_service_account(ns, agent_sa)
    cluster.apply_manifests(_binding(ns, "agent-overreach", {"rules": [erase_rule]}, agent_sa))
    eraser = cluster.mint_service_account_token(ns, "alice-admin", cluster.issuer)
    reader = cluster.mint_service_account_token(ns, "bob-reader", cluster.issuer)
    agent = cluster.mint_service_account_token(ns, agent_sa, AGENT_AUDIENCE)
    api = KubeAPI(server=cluster.server_url, ca_path=str(cluster.ca_path), token=proxy_token)
    async with httpx.AsyncClient(
        base_url=api.server, verify=ssl.create_default_context(cafile=str(cluster.ca_path)), timeout=10
    ) as http:
        yield World(KubeAdminAuthorizer(http, api, AGENT_AUDIENCE), ns, eraser, reader, agent, http, api)


async def test_a_person_with_the_memory_permission_is_authorised(world: World) -> None:
    admin = await world.authorizer.authorize(world.eraser, ERASE, world.namespace, "support-agent")
    assert admin.username == f"system:serviceaccount:{world.namespace}:alice-admin"
    reader = await world.authorizer.authorize(world.reader, READ, world.namespace, "support-agent")
    assert reader.username.endswith(":bob-reader")


async def test_rbac_denials_name_who_and_what(world: World) -> None:
    with pytest.raises(Forbidden, match=r"bob-reader.*cannot delete agentdeployments/memory 'support-agent'"):
        await world.authorizer.authorize(world.reader, ERASE, world.namespace, "support-agent")
    # alice's Role names one agent: another agent's memory, or every agent's at once, is not hers.
    with pytest.raises(Forbidden, match="cannot delete"):
        await world.authorizer.authorize(world.eraser, ERASE, world.namespace, "billing-agent")
    with pytest.raises(Forbidden, match="cannot delete"):
        await world.authorizer.authorize(world.eraser, ERASE, world.namespace, None)


async def test_an_agent_token_is_never_an_administrator(world: World) -> None:
    with pytest.raises(Forbidden, match="agent's token"):
        await world.authorizer.authorize(world.agent, ERASE, world.namespace, "support-agent")


async def test_missing_and_garbage_tokens_are_unauthenticated(world: World) -> None:
    for token in (None, "", "garbage"):
        with pytest.raises(Unauthenticated):
            await world.authorizer.authorize(token, ERASE, world.namespace, "support-agent")


async def test_administration_calls_are_rate_limited_before_the_api_server_is_asked(world: World) -> None:
    """Each admin call costs the API server reviews: beyond the budget the caller gets 503, and the API
    server is not asked (no review is counted)."""
    authorizer = KubeAdminAuthorizer(world.http, world.api, AGENT_AUDIENCE, rate=Rate(per_second=0.001, burst=2))
    for _ in range(2):
        await authorizer.authorize(world.reader, READ, world.namespace, "support-agent")
    asked = sum(authorizer.reviews.values())
    with pytest.raises(AuthUnavailable, match="rate limited"):
        await authorizer.authorize("garbage", READ, world.namespace, "support-agent")
    assert sum(authorizer.reviews.values()) == asked == 2
