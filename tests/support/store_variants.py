"""The proxy in this process over a real valkey-server, in each way its store can run: the accounting in
the write's own script (standalone Valkey), in separate calls (as on a Valkey Cluster), and with
encryption at rest. Suites of the conversation operations run once per variant, every answer the same."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import pytest

from sessionmem_core import env
from sessionmem_core.devauth import dev_token
from sessionmem_core.env import ProxySettings
from sessionmem_proxy.app import create_app
from sessionmem_proxy.datakeys import DirectoryDataKeyStore, Keyring, new_kek
from sessionmem_proxy.sealing import Sealer
from sessionmem_proxy.store import ConversationStore, UsageLedger
from sessionmem_proxy.valkey_client import connect
from tests.support.serving import served_client
from tests.support.valkey import ValkeyProcess

STORE_VARIANTS = ("one-script", "cluster-style", "sealed")


# Request rates no test of an operation reaches: suites that drive one agent far past a tenant's default rate
# (the rates themselves are tests/proxy/test_quotas.py's).
UNTHROTTLED = {env.QUOTA_REQUESTS_PER_SECOND: "100000", env.QUOTA_BURST: "100000"}


@contextlib.asynccontextmanager
async def proxy_client(
    variant: str, valkey_url: str, tmp_path: Path, headers: Mapping[str, str], **settings: str
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the dev-identity proxy on ``valkey_url`` with the store of ``variant`` (one of
    STORE_VARIANTS) and ``settings`` (sessionmem_core.env names) besides."""
    valkey = connect(valkey_url, 2.0)
    ledger = UsageLedger(valkey)
    ledger.atomic = variant != "cluster-style"
    sealer = None
    if variant == "sealed":
        (tmp_path / "kek").write_bytes(new_kek())
        sealer = Sealer(Keyring.load(tmp_path / "kek"), DirectoryDataKeyStore(tmp_path / "deks"))
    proxy_settings = ProxySettings.from_env({env.VALKEY_URL: valkey_url, env.AUTH_MODE: "dev", **settings})
    try:
        app = create_app(proxy_settings, store=ConversationStore(valkey, ledger, sealer))
        async with served_client(app) as served:
            served.headers.update(headers)
            yield served
    finally:
        await valkey.aclose()


@pytest.fixture(name="client", params=STORE_VARIANTS)
async def agent_client(
    request: pytest.FixtureRequest, valkey_server: ValkeyProcess, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    """``client``, for a suite that imports it: team-a/support-agent's client of the proxy on a real
    valkey-server, once per store variant ("sealed": with encryption at rest, every operation the same), at
    rates no suite reaches."""
    async with proxy_client(
        request.param,
        valkey_server.url,
        tmp_path,
        {"Authorization": f"Bearer {dev_token('team-a', 'support-agent')}"},
        **UNTHROTTLED,
    ) as served:
        yield served
