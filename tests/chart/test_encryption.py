"""Encryption at rest in the chart (issue #38): off by default, on with one value and a Secret, the
proxy's settings parser reading what the chart renders, and the Role the data keys need only when on.
Rendered with `helm template`, no API server (tests/proxy/test_data_key_secrets.py applies that Role to
a real one)."""

from __future__ import annotations

from pathlib import Path

from sessionmem_core import env
from sessionmem_core.env import ProxySettings
from tests.chart.test_lint import CHART, RELEASE, Doc, containers, find, names, pod_spec, render, resolved_env, run_helm

NAMESPACE = "memory"


def _proxy(docs: list[Doc]) -> Doc:
    return find(docs, "Deployment", names()["proxy"])


def _settings(docs: list[Doc]) -> ProxySettings:
    return ProxySettings.from_env(resolved_env(containers(_proxy(docs))[0], {"VALKEY_PASSWORD": "x"}))


def _data_key_rbac(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"].endswith("-data-keys")]


def test_off_by_default_nothing_is_sealed_and_no_secret_is_granted() -> None:
    docs = render(namespace=NAMESPACE)
    assert _settings(docs).sealing_keyring is None
    assert _data_key_rbac(docs) == []
    assert not [d for d in docs if d["kind"] == "Role" and "secrets" in str(d.get("rules"))]


def test_one_value_turns_it_on_with_the_keyring_secret_mounted() -> None:
    docs = render("--set", "proxy.encryption.enabled=true", namespace=NAMESPACE)
    settings = _settings(docs)
    assert settings.sealing_keyring is not None
    assert (settings.sealing_key_store, settings.sealing_namespace) == ("secret", NAMESPACE)
    assert settings.sealing_cache_seconds == 30.0
    proxy = _proxy(docs)
    mounts = {m["name"]: m for m in containers(proxy)[0]["volumeMounts"]}
    assert Path(settings.sealing_keyring) == Path(mounts["keyring"]["mountPath"])
    assert mounts["keyring"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod_spec(proxy)["volumes"]}
    assert volumes["keyring"]["secret"]["secretName"] == f"{names()['proxy']}-keyring"
    # Only the proxy's ServiceAccount gets Secrets, only in the release namespace, only these verbs.
    role, binding = sorted(_data_key_rbac(docs), key=lambda d: str(d["kind"]))
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "verbs": ["get", "list", "create", "update", "delete", "deletecollection"],
        }
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod_spec(proxy)["serviceAccountName"], "namespace": NAMESPACE}
    ]


def test_the_keyring_secret_and_cache_time_can_be_named() -> None:
    docs = render(
        "--set",
        "proxy.encryption.enabled=true",
        "--set",
        "proxy.encryption.keyringSecret=my-keks",
        "--set",
        "proxy.encryption.cacheSeconds=5",
        "--set",
        "proxy.encryption.openedCacheBytes=0",
    )
    assert {v["name"]: v for v in pod_spec(_proxy(docs))["volumes"]}["keyring"]["secret"]["secretName"] == "my-keks"
    assert _settings(docs).sealing_cache_seconds == 5.0
    assert _settings(docs).sealing_opened_bytes == 0, "the decrypted-entry memo can be turned off"
    assert _settings(render("--set", "proxy.encryption.enabled=true")).sealing_opened_bytes == 16 * 1024 * 1024
    assert env.SEALING_CACHE_SECONDS in {e["name"] for e in containers(_proxy(docs))[0]["env"]}


def test_the_data_keys_and_their_role_can_live_in_a_namespace_of_their_own() -> None:
    docs = render(
        "--set", "proxy.encryption.enabled=true", "--set", "proxy.encryption.dataKeyNamespace=memory-keys",
        namespace=NAMESPACE,
    )  # fmt: skip
    assert _settings(docs).sealing_namespace == "memory-keys"
    rbac = _data_key_rbac(docs)
    assert {d["metadata"]["namespace"] for d in rbac} == {"memory-keys"}
    binding = next(d for d in rbac if d["kind"] == "RoleBinding")
    assert binding["subjects"][0]["namespace"] == NAMESPACE  # the proxy's ServiceAccount stays where it runs


def test_the_schema_refuses_what_the_proxy_would_not_start_with() -> None:
    for bad in (
        "proxy.encryption.cacheSeconds=0",
        "proxy.encryption.openedCacheBytes=-1",
        "proxy.encryption.keyringSecret=Not_A_Name",
        "proxy.encryption.dataKeyNamespace=Not_A_Namespace",
        "proxy.encryption.x=1",
    ):
        proc = run_helm("template", RELEASE, str(CHART), "--set", bad, check=False)
        assert proc.returncode != 0, bad
