"""The TokenReview authenticator against a real kube-apiserver: pod binding required, one API call per
unknown token however many requests carry it, refusals cached, unknown tokens rate limited, and a revoked
identity refused within the (here shortened) revocation window. API calls are counted by the
authenticator itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sessionmem_core import kube
from sessionmem_core.errors import AuthUnavailable, Unauthenticated
from sessionmem_infra.serving import Rate
from sessionmem_proxy.kubeapi import KubeAPI
from sessionmem_proxy.tokenreview import API_SERVER_TOKEN_CACHE_SECONDS, TokenReviewAuthenticator
from tests.harness.apiserver import KubeTestCluster
from tests.support.kube_tokens import agent_pod_token

pytestmark = pytest.mark.integration

AUDIENCE = "sessionmem-proxy"

Make = Callable[..., TokenReviewAuthenticator]


def _reviewer_token(cluster: KubeTestCluster, namespace: str) -> str:
    """The proxy's own credential: a ServiceAccount allowed to create TokenReviews (what the chart grants)."""
    cluster.create_service_account(namespace, "sessionmem-proxy")
    cluster.apply_manifests(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{namespace}-tokenreview"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:auth-delegator",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "sessionmem-proxy", "namespace": namespace}],
            }
        ]
    )
    return cluster.mint_service_account_token(namespace, "sessionmem-proxy", cluster.issuer)


@pytest.fixture
async def make(kube_cluster: KubeTestCluster, kube_namespace: str) -> AsyncIterator[Make]:
    api = KubeAPI(
        server=kube_cluster.server_url,
        ca_path=str(kube_cluster.ca_path),
        token=_reviewer_token(kube_cluster, kube_namespace),
    )
    http = api.client(timeout_seconds=10.0)

    def build(**options: Any) -> TokenReviewAuthenticator:
        return TokenReviewAuthenticator(http, api, AUDIENCE, **options)

    yield build
    await http.aclose()


def agent_token(cluster: KubeTestCluster, namespace: str, agent: str) -> str:
    return agent_pod_token(cluster, namespace, kube.agent_service_account(agent), AUDIENCE)


async def test_a_pod_bound_token_is_an_agent_and_an_unbound_one_is_refused(
    make: Make, kube_cluster: KubeTestCluster, kube_namespace: str
) -> None:
    authenticator = make()
    identity = await authenticator.authenticate(agent_token(kube_cluster, kube_namespace, "bound"))
    assert (identity.owner.namespace, identity.owner.agent) == (kube_namespace, "bound")

    unbound = kube_cluster.mint_service_account_token(kube_namespace, kube.agent_service_account("bound"), AUDIENCE)
    with pytest.raises(Unauthenticated, match="not bound to a pod"):
        await authenticator.authenticate(unbound)


async def test_concurrent_requests_with_one_token_make_one_api_call(
    make: Make, kube_cluster: KubeTestCluster, kube_namespace: str
) -> None:
    authenticator = make()
    token = agent_token(kube_cluster, kube_namespace, "busy")
    identities = await asyncio.gather(*(authenticator.authenticate(token) for _ in range(32)))
    assert {i.owner.agent for i in identities} == {"busy"}
    assert authenticator.api_calls == 1
    await authenticator.authenticate(token)
    assert authenticator.api_calls == 1  # cached


async def test_garbage_tokens_are_cached_negatively_and_single_flight(make: Make) -> None:
    authenticator = make()
    garbage = "not-a-token-" + "x" * 40
    results = await asyncio.gather(*(authenticator.authenticate(garbage) for _ in range(16)), return_exceptions=True)
    assert all(isinstance(r, Unauthenticated) for r in results)
    for _ in range(5):
        with pytest.raises(Unauthenticated):
            await authenticator.authenticate(garbage)
    assert authenticator.api_calls == 1


async def test_api_calls_for_unknown_tokens_are_rate_limited_while_known_tokens_work(
    make: Make, kube_cluster: KubeTestCluster, kube_namespace: str
) -> None:
    authenticator = make(rate=Rate(per_second=0.001, burst=3))
    token = agent_token(kube_cluster, kube_namespace, "steady")
    await authenticator.authenticate(token)
    for i in range(2):
        with pytest.raises(Unauthenticated):
            await authenticator.authenticate(f"garbage-{i}")
    with pytest.raises(AuthUnavailable):
        await authenticator.authenticate("garbage-over-budget")
    assert authenticator.api_calls == 3
    assert (await authenticator.authenticate(token)).owner.agent == "steady"


async def test_a_revoked_identity_is_refused_within_the_window(
    make: Make, kube_cluster: KubeTestCluster, kube_namespace: str
) -> None:
    window = 1.0
    authenticator = make(max_cache_seconds=window)
    token = agent_token(kube_cluster, kube_namespace, "revoked")
    await authenticator.authenticate(token)
    kube_cluster.rest.request(
        "DELETE", f"/api/v1/namespaces/{kube_namespace}/serviceaccounts/{kube.agent_service_account('revoked')}"
    )
    revoked_at = time.monotonic()
    # The window, plus the API server's own cache of verified tokens (10 s) and a margin.
    deadline = revoked_at + window + API_SERVER_TOKEN_CACHE_SECONDS + 5.0
    while time.monotonic() < deadline:
        try:
            await authenticator.authenticate(token)
        except Unauthenticated:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("a deleted ServiceAccount's token still works past the revocation window")
    print(f"refused {time.monotonic() - revoked_at:.1f} s after the ServiceAccount was deleted")
