"""Per-agent quota limits read from AgentDeployments on a real kube-apiserver: the override applies, an
agent without one gets the defaults, and concurrent requests for one agent make one API call per cache
period (counted by the limit source itself)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from sessionmem_core import kube
from sessionmem_core.keys import Owner
from sessionmem_proxy.admission import KubeAgentLimits, QuotaLimits
from tests.harness.apiserver import KubeTestCluster

pytestmark = pytest.mark.integration

DEFAULTS = QuotaLimits(max_conversations=100, max_bytes=1_000_000, requests_per_second=200.0, burst=400)


def _reader_token(cluster: KubeTestCluster, namespace: str) -> str:
    """A ServiceAccount that may read AgentDeployments, as the chart lets the proxy."""
    cluster.create_service_account(namespace, "quota-reader")
    role = f"{namespace}-agent-reader"
    cluster.apply_manifests(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": [{"apiGroups": [kube.GROUP], "resources": [kube.AGENT_PLURAL], "verbs": ["get"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "quota-reader", "namespace": namespace}],
            },
        ]
    )
    return cluster.mint_service_account_token(namespace, "quota-reader", cluster.issuer)


@pytest.fixture
async def http(kube_cluster: KubeTestCluster) -> AsyncIterator[httpx.AsyncClient]:
    import ssl

    client = httpx.AsyncClient(
        base_url=kube_cluster.server_url,
        verify=ssl.create_default_context(cafile=str(kube_cluster.ca_path)),
        timeout=10,
    )
    yield client
    await client.aclose()


def _crd_has_quota(cluster: KubeTestCluster) -> bool:
    crd = cluster.rest.request(
        "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{kube.AGENT_PLURAL}.{kube.GROUP}"
    ).json()
    schema: Any = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    memory = schema["properties"]["spec"]["properties"].get("sessionMemory", {})
    return "quota" in memory.get("properties", {})


async def test_an_agent_deployment_quota_overrides_the_defaults(
    kube_cluster: KubeTestCluster, kube_namespace: str, http: httpx.AsyncClient
) -> None:
    if not _crd_has_quota(kube_cluster):
        pytest.skip("crds/agentdeployment.yaml has no spec.sessionMemory.quota yet")
    token = _reader_token(kube_cluster, kube_namespace)
    kube_cluster.apply_manifests(
        [
            {
                "apiVersion": kube.API_VERSION,
                "kind": kube.AGENT_KIND,
                "metadata": {"name": "limited", "namespace": kube_namespace},
                "spec": {
                    "image": "agent:1",
                    "executionModel": "deployment",
                    "sessionMemory": {"quota": {"maxConversations": 3, "maxBytes": 4096, "requestsPerSecond": 5}},
                },
            }
        ]
    )
    limits = KubeAgentLimits(http, lambda: token, DEFAULTS, cache_seconds=60)
    assert await limits.limits_of(Owner(kube_namespace, "limited")) == QuotaLimits(3, 4096, 5.0, 10)
    kube_cluster.apply_manifests(
        [
            {
                "apiVersion": kube.API_VERSION,
                "kind": kube.AGENT_KIND,
                "metadata": {"name": "per-user", "namespace": kube_namespace},
                "spec": {"image": "agent:1", "executionModel": "deployment", "sessionMemory": {"perUser": True}},
            }
        ]
    )
    # perUser comes from the cluster's truth too: the key resolver refuses that agent's user-less calls.
    assert (await limits.limits_of(Owner(kube_namespace, "per-user"))).per_user is True
    assert (await limits.limits_of(Owner(kube_namespace, "limited"))).per_user is False


async def test_no_agent_deployment_means_the_defaults_with_one_call_per_cache_period(
    kube_cluster: KubeTestCluster, kube_namespace: str, http: httpx.AsyncClient
) -> None:
    token = _reader_token(kube_cluster, kube_namespace)
    limits = KubeAgentLimits(http, lambda: token, DEFAULTS, cache_seconds=60)
    owner = Owner(kube_namespace, "absent")
    answers = await asyncio.gather(*(limits.limits_of(owner) for _ in range(16)))
    assert set(answers) == {DEFAULTS}
    assert limits.api_calls == 1
    await limits.limits_of(owner)
    assert limits.api_calls == 1
    # Without permission to read AgentDeployments the defaults apply too (never a locked-out agent).
    # (its perUser flag is then unknown: None, on which the key resolver fails closed).
    forbidden = KubeAgentLimits(http, lambda: "not-a-token", DEFAULTS, cache_seconds=60)
    assert await forbidden.limits_of(owner) == dataclasses.replace(DEFAULTS, per_user=None)
