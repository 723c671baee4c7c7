"""The test harness itself, against the real control plane it starts (no mocks)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import KubeApiError, KubeRestClient, KubeTestCluster

pytestmark = pytest.mark.integration

AUDIENCE = "sessionmem-proxy"


def _wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)


def _jwt_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert isinstance(claims, dict)
    return claims


def _ksvc(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def test_apiserver_answers(kube_cluster: KubeTestCluster) -> None:
    version = kube_cluster.rest.get_json("/version")
    assert version["gitVersion"].startswith("v1.")
    assert kube_cluster.rest.request("GET", "/readyz").text == "ok"
    assert kube_cluster.server_url.startswith("https://127.0.0.1:")
    assert kube_cluster.kubeconfig_path.is_file()
    assert kube_cluster.ca_path.is_file()
    kube_cluster.check_processes()


def test_admin_client_certificate_is_accepted(kube_cluster: KubeTestCluster) -> None:
    import ssl

    import httpx

    ctx = ssl.create_default_context(cafile=str(kube_cluster.ca_path))
    ctx.load_cert_chain(str(kube_cluster.client_cert_path), str(kube_cluster.client_key_path))
    with httpx.Client(base_url=kube_cluster.server_url, verify=ctx) as http:
        resp = http.get("/api/v1/namespaces/kube-system")
    assert resp.status_code == 200, resp.text


def test_namespace_fixture_creates_an_active_namespace(kube_cluster: KubeTestCluster, kube_namespace: str) -> None:
    assert kube_namespace.startswith("t-namespace-fixture")
    ns = kube_cluster.rest.get("v1", "Namespace", kube_namespace)
    assert ns is not None
    assert ns["status"]["phase"] == "Active"


def test_create_namespace_and_namespace_controller_finalizes_it(kube_cluster: KubeTestCluster) -> None:
    name = kube_cluster.create_namespace("harness-ns-lifecycle", labels={"purpose": "test"})
    kube_cluster.apply_manifests(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: inside}\ndata: {k: v}\n", namespace=name
    )
    ns = kube_cluster.rest.get("v1", "Namespace", name)
    assert ns is not None and ns["metadata"]["labels"]["purpose"] == "test"
    # Only the namespace controller empties and finalizes a terminating namespace.
    kube_cluster.delete_namespace(name, wait=True, timeout=60)
    assert kube_cluster.rest.get("v1", "Namespace", name) is None


def test_apply_is_create_or_update(kube_cluster: KubeTestCluster, kube_namespace: str) -> None:
    doc: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "1"}}
    first = kube_cluster.apply_manifests(doc, namespace=kube_namespace)[0]
    updated: dict[str, Any] = {**doc, "data": {"a": "2"}}
    second = kube_cluster.apply_manifests(updated, namespace=kube_namespace)[0]
    assert first["metadata"]["uid"] == second["metadata"]["uid"]
    assert second["data"] == {"a": "2"}


def test_knative_crds_installed(kube_cluster: KubeTestCluster) -> None:
    for name in ("services", "configurations", "revisions", "routes"):
        crd = kube_cluster.wait_for_crd_established(f"{name}.serving.knative.dev", timeout=5)
        assert crd["spec"]["group"] == "serving.knative.dev"


def test_knative_service_schema_is_enforced_by_the_server(kube_cluster: KubeTestCluster, kube_namespace: str) -> None:
    bad = _ksvc("bad", kube_namespace, {"template": {"spec": {"containers": "ghcr.io/my-org/agent:1.0"}}})
    with pytest.raises(KubeApiError) as err:
        kube_cluster.rest.create(bad)
    assert err.value.code == 422
    assert err.value.reason == "Invalid"
    assert "containers" in err.value.message

    missing = _ksvc("missing", kube_namespace, {"template": {"spec": {}}})
    with pytest.raises(KubeApiError) as err:
        kube_cluster.rest.create(missing)
    assert err.value.code == 422
    assert "containers" in err.value.message

    good = _ksvc(
        "good",
        kube_namespace,
        {
            "template": {
                "spec": {"containers": [{"image": "ghcr.io/my-org/agent:1.0", "ports": [{"containerPort": 8080}]}]}
            }
        },
    )
    created = kube_cluster.rest.create(good)
    assert created["metadata"]["uid"]
    stored = kube_cluster.rest.get("serving.knative.dev/v1", "Service", "good", kube_namespace)
    assert stored is not None
    assert stored["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/my-org/agent:1.0"


def _owned_configmap(name: str, namespace: str, owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {"owned": "yes"},
    }


def test_garbage_collector_deletes_dependents_of_a_deleted_owner(
    kube_cluster: KubeTestCluster, kube_namespace: str
) -> None:
    rest = kube_cluster.rest
    owner = rest.apply(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "owner", "namespace": kube_namespace}}
    )
    rest.apply(_owned_configmap("dependent", kube_namespace, owner))
    bystander = rest.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bystander", "namespace": kube_namespace}}
    )
    assert rest.get("v1", "ConfigMap", "dependent", kube_namespace) is not None

    assert rest.delete("v1", "Secret", "owner", kube_namespace, propagation_policy="Background")
    _wait_until(
        lambda: rest.get("v1", "ConfigMap", "dependent", kube_namespace) is None,
        timeout=60,
        what="the garbage collector to delete the dependent ConfigMap",
    )
    still = rest.get("v1", "ConfigMap", "bystander", kube_namespace)
    assert still is not None and still["metadata"]["uid"] == bystander["metadata"]["uid"]


def test_garbage_collector_handles_custom_resource_owners(kube_cluster: KubeTestCluster, kube_namespace: str) -> None:
    """CRDs installed at start (before the controller-manager) are watched by the GC right away."""
    rest = kube_cluster.rest
    owner = rest.apply(
        _ksvc("owner", kube_namespace, {"template": {"spec": {"containers": [{"image": "example.com/agent:1"}]}}})
    )
    rest.apply(_owned_configmap("ksvc-dependent", kube_namespace, owner))
    # Foreground: the owner stays (with a deletionTimestamp) until the GC removed its blocking dependents.
    assert rest.delete("serving.knative.dev/v1", "Service", "owner", kube_namespace, propagation_policy="Foreground")
    _wait_until(
        lambda: (
            rest.get("v1", "ConfigMap", "ksvc-dependent", kube_namespace) is None
            and rest.get("serving.knative.dev/v1", "Service", "owner", kube_namespace) is None
        ),
        timeout=60,
        what="foreground cascading deletion of a Knative Service and its ConfigMap",
    )


def test_token_request_and_token_review_round_trip(kube_cluster: KubeTestCluster, kube_namespace: str) -> None:
    kube_cluster.create_service_account(kube_namespace, "agent")
    token = kube_cluster.mint_service_account_token(kube_namespace, "agent", AUDIENCE, expiration_seconds=600)

    claims = _jwt_claims(token)
    assert claims["aud"] == [AUDIENCE]
    assert claims["iss"] == kube_cluster.issuer
    assert claims["sub"] == f"system:serviceaccount:{kube_namespace}:agent"
    assert 590 <= claims["exp"] - claims["iat"] <= 610

    ok = kube_cluster.token_review(token, audiences=[AUDIENCE])
    assert ok["authenticated"] is True, ok
    assert ok["user"]["username"] == f"system:serviceaccount:{kube_namespace}:agent"
    assert f"system:serviceaccounts:{kube_namespace}" in ok["user"]["groups"]
    assert ok["audiences"] == [AUDIENCE]

    wrong = kube_cluster.token_review(token, audiences=["someone-else"])
    assert wrong.get("authenticated") is not True
    assert "audience" in wrong.get("error", "").lower(), wrong

    # Without explicit audiences the server checks against its own --api-audiences, which excludes ours.
    default = kube_cluster.token_review(token)
    assert default.get("authenticated") is not True


def test_rbac_is_enforced_for_service_account_tokens(kube_cluster: KubeTestCluster, kube_namespace: str) -> None:
    kube_cluster.create_service_account(kube_namespace, "reader")
    api_token = kube_cluster.mint_service_account_token(kube_namespace, "reader", kube_cluster.issuer)
    path = f"/api/v1/namespaces/{kube_namespace}/configmaps"
    with KubeRestClient(kube_cluster.server_url, kube_cluster.ca_path, api_token) as as_sa:
        with pytest.raises(KubeApiError) as err:
            as_sa.request("GET", path)
        assert err.value.code == 403

        kube_cluster.apply_manifests(
            [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "cm-reader"},
                    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": "cm-reader"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
                    "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": kube_namespace}],
                },
            ],
            namespace=kube_namespace,
        )
        _wait_until(
            lambda: as_sa.request("GET", path, ok=(403,)).status_code == 200,
            timeout=15,
            what="the RoleBinding to take effect",
        )


async def test_kubernetes_asyncio_client_via_kube_api(kube_api: Any, kube_namespace: str) -> None:
    from kubernetes_asyncio import client

    async with client.ApiClient(configuration=kube_api) as api:
        core = client.CoreV1Api(api)
        ns = await core.read_namespace(kube_namespace)
        assert ns.status.phase == "Active"
        await core.create_namespaced_config_map(
            kube_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="from-async"), data={"k": "v"})
        )
        listed = await core.list_namespaced_config_map(kube_namespace)
        assert "from-async" in {cm.metadata.name for cm in listed.items}


async def test_kubeconfig_env_is_loadable(kube_env: dict[str, str], kube_namespace: str) -> None:
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    await config.load_kube_config(config_file=kube_env["KUBECONFIG"], client_configuration=cfg)
    async with client.ApiClient(configuration=cfg) as api:
        ns = await client.CoreV1Api(api).read_namespace(kube_namespace)
        assert ns.metadata.name == kube_namespace


def test_kopf_finds_the_cluster_through_kube_env(kube_cluster: KubeTestCluster, kube_env: dict[str, str]) -> None:
    import kopf

    info = kopf.login_with_kubeconfig(settings=kopf.OperatorSettings())
    assert info is not None
    assert info.server == kube_cluster.server_url
    assert info.token == kube_cluster.admin_token
    assert info.ca_path == str(kube_cluster.ca_path)
