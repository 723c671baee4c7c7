"""An agent's request rate across the proxy Deployment: two proxy processes (two replicas) on one Valkey,
the agent's requests spread over both, as a Service spreads connections. What both admit together stays
within the one rate the agent was given, not twice it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from sessionmem_core import env
from tests.adversarial.rawhttp import TOKEN
from tests.support.processes import ServiceProcess, dev_proxy
from tests.support.valkey import ValkeyProcess

RATE = 10
BURST = 10
REPLICAS = 2
SECONDS = 2.0


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[ServiceProcess]]:
    valkey = ValkeyProcess()
    valkey.start()
    proxies = [
        dev_proxy(
            valkey.url,
            **{
                env.QUOTA_REQUESTS_PER_SECOND: str(RATE),
                env.QUOTA_BURST: str(BURST),
                env.QUOTA_RATE_SHARE: str(REPLICAS),
                "SESSIONMEM_PROXY_WORKERS": "1",
            },
        )
        for _ in range(REPLICAS)
    ]
    try:
        for proxy in proxies:
            proxy.start()
        yield proxies
    finally:
        for proxy in proxies:
            proxy.stop()
        valkey.close()


def test_an_agents_rate_holds_across_replicas(replicas: list[ServiceProcess]) -> None:
    clients = [
        httpx.Client(base_url=proxy.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        for proxy in replicas
    ]
    admitted = refused = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < SECONDS:
            for client in clients:
                status = client.get("/v1/conversations/spread/entries?limit=1").status_code
                assert status in (200, 429), status
                admitted += status == 200
                refused += status == 429
    finally:
        elapsed = time.monotonic() - started
        for client in clients:
            client.close()
    allowed = RATE * elapsed + BURST
    assert refused, "the agent went past its rate"
    assert admitted <= allowed + REPLICAS, f"{admitted} admitted in {elapsed:.1f} s at {RATE}/s, burst {BURST}"
