"""The Kubernetes Secret data key store against a real API server, as the proxy's ServiceAccount with the
Role the chart renders when encryption is on (and with nothing more): keys made once across replicas,
erasure by name and by an agent's label, re-wrapping, and fail-closed answers without the Role or the
API server."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessionmem_core import env
from sessionmem_core.env import ProxySettings
from sessionmem_core.errors import DataKeyUnavailable
from sessionmem_core.keys import data_key_unit as unit_of
from sessionmem_proxy.datakeys import (
    SECRET_TYPE,
    Keyring,
    SecretDataKeyStore,
    new_data_key,
    new_kek,
    rewrap,
    secret_name,
)
from sessionmem_proxy.kubeapi import KubeAPI
from sessionmem_proxy.sealing import Sealer, sealer_from_settings
from tests.chart.test_lint import render
from tests.harness.apiserver import KubeTestCluster

PROXY_SA = "sessionmem-proxy"
AGENT_KEY = "mem:team-a/support:c1"
BUCKET_KEY = "mem:team-a/support:u:" + "b" * 32 + ":c1"
NEIGHBOUR_KEY = "mem:team-a/billing:c1"
SHARED_KEY = "mem:shared:ops:c1"


@dataclass
class KeyWorld:
    cluster: KubeTestCluster
    namespace: str
    http: httpx.AsyncClient
    token: str

    def store(self, token: str | None = None) -> SecretDataKeyStore:
        bearer = token or self.token
        return SecretDataKeyStore(self.http, lambda: bearer, self.namespace)

    def secrets(self) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{self.namespace}/secrets"
        items: list[dict[str, Any]] = self.cluster.rest.request("GET", path).json()["items"]
        return [s for s in items if s.get("type") == SECRET_TYPE]


def _chart_role(namespace: str) -> list[dict[str, Any]]:
    """The chart's data key Role and RoleBinding, moved to the test's namespace and ServiceAccount."""
    docs = render("--set", "proxy.encryption.enabled=true", namespace=namespace)
    rbac = [d for d in docs if d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"].endswith("-data-keys")]
    assert len(rbac) == 2
    for doc in rbac:
        if doc["kind"] == "RoleBinding":
            doc["subjects"] = [{"kind": "ServiceAccount", "name": PROXY_SA, "namespace": namespace}]
    return rbac


@pytest.fixture
async def world(kube_cluster: KubeTestCluster, kube_namespace: str) -> AsyncIterator[KeyWorld]:
    kube_cluster.create_service_account(kube_namespace, PROXY_SA)
    kube_cluster.apply_manifests(_chart_role(kube_namespace), namespace=kube_namespace)
    token = kube_cluster.mint_service_account_token(kube_namespace, PROXY_SA, kube_cluster.issuer)
    trust = ssl.create_default_context(cafile=str(kube_cluster.ca_path))
    async with httpx.AsyncClient(base_url=kube_cluster.server_url, verify=trust) as http:
        yield KeyWorld(kube_cluster, kube_namespace, http, token)


def _keyring(folder: Path, *kids: str) -> Keyring:
    folder.mkdir(exist_ok=True)
    for kid in kids:
        (folder / kid).write_bytes(new_kek())
    return Keyring.load(folder)


async def test_secrets_keep_one_key_per_unit_and_erasure_deletes_them(world: KeyWorld, tmp_path: Path) -> None:
    keyring = _keyring(tmp_path / "kek", "k1")
    first, second = Sealer(keyring, world.store()), Sealer(keyring, world.store())
    key = await first.writing_key(AGENT_KEY)
    # Another replica racing for the same unit's first key ends up with the one that was stored.
    racing, _ = await new_data_key(keyring, unit_of(AGENT_KEY))
    assert (await world.store().create(racing)).dek_id != racing.dek_id
    assert (await second.writing_key(AGENT_KEY)).header == key.header
    for conversation in (BUCKET_KEY, NEIGHBOUR_KEY, SHARED_KEY):
        await first.writing_key(conversation)
    stored = world.secrets()
    assert len(stored) == 4
    # The Secret names a unit by digest only; the wrapped key is in its data, never a key in clear.
    assert {s["metadata"]["name"] for s in stored} == {
        secret_name(unit_of(k)) for k in (AGENT_KEY, BUCKET_KEY, NEIGHBOUR_KEY, SHARED_KEY)
    }

    assert await first.erase(unit_of(BUCKET_KEY)) == [unit_of(BUCKET_KEY)]
    assert len(world.secrets()) == 3
    # The agent's erasure takes its users' buckets and nothing of its neighbour's.
    await first.writing_key(BUCKET_KEY)
    assert await first.erase(unit_of(AGENT_KEY)) == sorted([unit_of(AGENT_KEY), unit_of(BUCKET_KEY)])
    left = {s["metadata"]["annotations"]["sessionmem.ctxmesh.ai/unit"] for s in world.secrets()}
    assert left == {unit_of(NEIGHBOUR_KEY), unit_of(SHARED_KEY)}
    assert await world.store().load(unit_of(AGENT_KEY)) is None
    assert await first.erase(unit_of(SHARED_KEY)) == [unit_of(SHARED_KEY)]


async def test_rewrap_moves_every_secret_to_the_newest_kek(world: KeyWorld, tmp_path: Path) -> None:
    folder = tmp_path / "kek"
    old = _keyring(folder, "2026-11")
    sealer = Sealer(old, world.store())
    before = await sealer.writing_key(AGENT_KEY)
    await sealer.writing_key(SHARED_KEY)
    rotated = _keyring(folder, "2026-12")
    # Listed one Secret per page, so the listing follows the API server's continue tokens.
    paged = SecretDataKeyStore(world.http, lambda: world.token, world.namespace, page=1)
    assert await rewrap(rotated, paged) == (2, 0)
    assert {r.kid for r in await world.store().records()} == {"2026-12"}
    (folder / "2026-11").unlink()
    assert (await Sealer(Keyring.load(folder), world.store()).writing_key(AGENT_KEY)).header == before.header


async def test_without_the_role_or_the_api_server_the_store_fails_closed(
    world: KeyWorld, kube_cluster: KubeTestCluster, tmp_path: Path
) -> None:
    kube_cluster.create_service_account(world.namespace, "no-rights")
    stranger = kube_cluster.mint_service_account_token(world.namespace, "no-rights", kube_cluster.issuer)
    sealer = Sealer(_keyring(tmp_path / "kek", "k1"), world.store(stranger))
    with pytest.raises(DataKeyUnavailable, match="403"):
        await sealer.writing_key(AGENT_KEY)
    with pytest.raises(DataKeyUnavailable, match="403"):
        await sealer.erase(unit_of(AGENT_KEY))
    assert world.secrets() == []
    async with httpx.AsyncClient(base_url="https://127.0.0.1:1") as nowhere:
        unreachable = SecretDataKeyStore(nowhere, lambda: world.token, world.namespace)
        with pytest.raises(DataKeyUnavailable, match="unavailable"):
            await unreachable.load(unit_of(AGENT_KEY))


async def test_the_proxys_settings_build_the_secret_store(
    world: KeyWorld, kube_cluster: KubeTestCluster, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(world.token)
    (tmp_path / "kek").write_bytes(new_kek())
    values = {
        env.SEALING_KEYRING: str(tmp_path / "kek"),
        env.SEALING_NAMESPACE: world.namespace,
        env.KUBE_API_SERVER: kube_cluster.server_url,
        env.KUBE_CA_FILE: str(kube_cluster.ca_path),
        env.KUBE_TOKEN_FILE: str(tmp_path / "token"),
    }
    sealer, close = sealer_from_settings(ProxySettings.from_env(values), KubeAPI.from_settings)
    assert sealer is not None and close is not None
    try:
        await sealer.writing_key(AGENT_KEY)
    finally:
        await close()
    assert [s["metadata"]["name"] for s in world.secrets()] == [secret_name(unit_of(AGENT_KEY))]
    assert sealer_from_settings(ProxySettings.from_env({}), KubeAPI.from_settings) == (None, None)
    without_namespace = {k: v for k, v in values.items() if k != env.SEALING_NAMESPACE}
    with pytest.raises(ValueError, match="SESSIONMEM_SEALING_NAMESPACE"):
        sealer_from_settings(ProxySettings.from_env(without_namespace), KubeAPI.from_settings)
