"""Projected-style agent tokens for tests against the harness's kube-apiserver: a token bound to a pod, as
the kubelet mounts one (TokenRequest with a boundObjectRef), which is what the proxy accepts."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from tests.harness.apiserver import KubeTestCluster


def create_pod(cluster: KubeTestCluster, namespace: str, name: str, service_account: str) -> dict[str, Any]:
    """A pod object running as ``service_account`` (never scheduled: the harness has no kubelet)."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"serviceAccountName": service_account, "containers": [{"name": "agent", "image": "agent:1"}]},
    }
    response = cluster.rest.request("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods", body=body)
    pod: dict[str, Any] = response.json()
    return pod


def pod_bound_token(
    cluster: KubeTestCluster, namespace: str, service_account: str, audience: str, pod: dict[str, Any]
) -> str:
    """A TokenRequest token for ``service_account`` bound to ``pod`` (its name and uid)."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [audience],
            "expirationSeconds": 600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        },
    }
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/serviceaccounts/{quote(service_account, safe='')}/token"
    token = cluster.rest.request("POST", path, body=body).json()["status"]["token"]
    assert isinstance(token, str)
    return token


def agent_pod_token(cluster: KubeTestCluster, namespace: str, service_account: str, audience: str) -> str:
    """Create the ServiceAccount (if needed) and a pod running as it, and return a token bound to that pod."""
    cluster.create_service_account(namespace, service_account)
    existing = cluster.rest.request(
        "GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{service_account}-pod", ok=(404,)
    )
    pod = (
        existing.json()
        if existing.status_code == 200
        else create_pod(cluster, namespace, f"{service_account}-pod", service_account)
    )
    return pod_bound_token(cluster, namespace, service_account, audience, pod)
