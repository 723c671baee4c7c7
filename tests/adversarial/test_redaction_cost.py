"""Redaction is work the proxy does for one agent alone: an agent that asks for it over text that makes it
expensive (card-like digits) pays for the CPU it took in its transfer rate, and is refused (429) before it
can take the proxy's CPU from everyone else."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from sessionmem_core import env
from tests.adversarial.rawhttp import TOKEN
from tests.support.processes import ServiceProcess, dev_proxy
from tests.support.valkey import ValkeyProcess

# 1 MiB/s: the burst is then two maximal bodies (2 MiB). One body below of ~0.75 MB, all card-like digits,
# takes the card redactor most of a CPU-second (0.67 s measured on a loaded two-core machine); at
# ten seconds of the rate per CPU-second it leaves the agent in debt from 0.13 s of CPU on.
RATE = 1024 * 1024
DIGITS = ("4111 1111 1111 111" * 20_000)[:240_000]


@pytest.fixture(scope="module")
def proxy() -> Iterator[ServiceProcess]:
    valkey = ValkeyProcess()
    valkey.start()
    process = dev_proxy(
        valkey.url,
        **{
            env.QUOTA_BYTES_PER_SECOND: str(RATE),
            env.QUOTA_REQUESTS_PER_SECOND: "1000",
            env.QUOTA_BURST: "1000",
            "SESSIONMEM_PROXY_WORKERS": "1",
        },
    )
    try:
        process.start()
        yield process
    finally:
        process.stop()
        valkey.close()


def test_the_cpu_of_a_costly_redaction_is_charged_to_the_agent(proxy: ServiceProcess) -> None:
    body = orjson.dumps({"entries": [{"role": "user", "content": DIGITS} for _ in range(3)]})
    headers = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    with httpx.Client(base_url=proxy.base_url, headers=headers, timeout=60) as client:
        first = client.post("/v1/conversations/cards/entries?redact=card", content=body)
        second = client.get("/v1/conversations/cards/entries?limit=1")
    assert first.status_code == 200, first.text[:200]
    assert len(body) < 2 * env.MAX_BODY_BYTES - RATE, "the body alone leaves the burst far from spent"
    assert second.status_code == 429 and "transfer rate" in second.json()["error"]["message"], second.text[:200]
