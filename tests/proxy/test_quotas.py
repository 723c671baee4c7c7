"""Per-agent quotas on the proxy's app against a real valkey-server: conversations and bytes (507), request
rate (429 with Retry-After), each confined to the agent over it; the accounting follows trims, deletes and
TTL expiry."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from sessionmem_core import env
from sessionmem_core.devauth import dev_token
from sessionmem_core.env import ProxySettings
from sessionmem_core.errors import QuotaExceeded, RateLimited
from sessionmem_core.keys import Owner, usage_keys
from sessionmem_proxy.admission import DefaultLimits, QuotaLimits, Quotas
from sessionmem_proxy.app import create_app
from sessionmem_proxy.store import ConversationStore, UsageLedger
from sessionmem_proxy.valkey_client import connect
from tests.support.serving import served_client
from tests.support.valkey import ValkeyProcess

A = {"Authorization": f"Bearer {dev_token('team-a', 'greedy')}"}
B = {"Authorization": f"Bearer {dev_token('team-b', 'polite')}"}


def settings(server: ValkeyProcess, **quota: str) -> ProxySettings:
    return ProxySettings.from_env({env.VALKEY_URL: server.url, env.AUTH_MODE: "dev", **quota})


@pytest.fixture(params=["one-script", "cluster-style"])
async def client_for(
    request: pytest.FixtureRequest, valkey_server: ValkeyProcess
) -> AsyncIterator[Callable[..., Awaitable[httpx.AsyncClient]]]:
    """Builds the proxy app with the given quota settings; returns an httpx client to it. Each test runs
    twice: with the accounting in the write's own script (standalone Valkey), and in separate calls before
    and after the write (what a Valkey Cluster needs), both on the real server."""
    valkeys: list[Any] = []
    async with contextlib.AsyncExitStack() as stack:

        async def make(**quota: str) -> httpx.AsyncClient:
            valkey = connect(valkey_server.url, 2.0)
            valkeys.append(valkey)
            ledger = UsageLedger(valkey)
            ledger.atomic = request.param == "one-script"
            app = create_app(settings(valkey_server, **quota), store=ConversationStore(valkey, ledger))
            return await stack.enter_async_context(served_client(app))

        yield make
    for valkey in valkeys:
        await valkey.aclose()


def large_body() -> dict[str, Any]:
    """Three entries of the largest content: about 3/8 of the transfer burst (two maximal bodies)."""
    return {"entries": [{"role": "user", "content": "x" * (env.MAX_CONTENT_CHARS - 100)}] * 3}


def entry(content: str, message_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"entries": [{"role": "user", "content": content}]}
    if message_id:
        body["entries"][0]["id"] = message_id
    return body


async def append(client: httpx.AsyncClient, who: dict[str, str], cid: str, content: str = "hi", **query: Any):  # type: ignore[no-untyped-def]
    return await client.post(f"/v1/conversations/{cid}/entries", json=entry(content), headers=who, params=query)


async def test_conversation_quota_is_a_507_for_that_agent_only(
    client_for: Callable[..., Awaitable[httpx.AsyncClient]],
) -> None:
    client = await client_for(**{env.QUOTA_CONVERSATIONS: "2"})
    assert (await append(client, A, "c1")).status_code == 200
    assert (await append(client, A, "c2")).status_code == 200
    over = await append(client, A, "c3")
    assert over.status_code == 507 and over.json()["error"]["type"] == "quota_exceeded"
    # A conversation the agent already has may still be written; another agent is untouched.
    assert (await append(client, A, "c1")).status_code == 200
    for cid in ("c1", "c3"):
        assert (await append(client, B, cid)).status_code == 200
    # Erasing a conversation gives its place back.
    assert (await client.delete("/v1/conversations/c2", headers=A)).status_code == 200
    assert (await append(client, A, "c3")).status_code == 200


async def test_concurrent_new_conversations_never_pass_the_count(
    client_for: Callable[..., Awaitable[httpx.AsyncClient]], valkey_server: ValkeyProcess
) -> None:
    client = await client_for(**{env.QUOTA_CONVERSATIONS: "5"})
    answers = await asyncio.gather(*(append(client, A, f"c{i}") for i in range(40)))
    assert sorted(a.status_code for a in answers) == [200] * 5 + [507] * 35
    assert len(valkey_server.client().keys("mem:team-a/greedy:*")) == 5


async def test_byte_quota_is_a_507_and_follows_the_cap(
    client_for: Callable[..., Awaitable[httpx.AsyncClient]], valkey_server: ValkeyProcess
) -> None:
    client = await client_for(**{env.QUOTA_BYTES: "4000"})
    # Under a cap of 2 the conversation stays ~2 entries however many are appended: never over quota.
    for i in range(10):
        assert (await append(client, A, "capped", "x" * 1000, cap=2)).status_code == 200, i
    statuses = [(await append(client, A, f"big{i}", "y" * 1000)).status_code for i in range(4)]
    assert statuses[0] == 200 and statuses[-1] == 507
    assert (await append(client, B, "fine", "z" * 3000)).status_code == 200
    # The accounting is the stored bytes themselves.
    sync = valkey_server.client()
    stored = sum(len(raw) for key in sync.keys("mem:team-a/greedy:*") for raw in sync.lrange(key.decode(), 0, -1))
    raw: Any = sync  # valkey-py's sync hget is untyped in tests.support
    assert int(raw.hget(usage_keys("team-a/greedy")[1], "total")) == stored


async def test_expired_conversations_stop_counting(client_for: Callable[..., Awaitable[httpx.AsyncClient]]) -> None:
    client = await client_for(**{env.QUOTA_CONVERSATIONS: "1"})
    assert (await append(client, A, "short", ttlSeconds=1)).status_code == 200
    assert (await append(client, A, "next")).status_code == 507
    deadline = time.monotonic() + 10
    while (status := (await append(client, A, "next")).status_code) == 507 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert status == 200


async def test_request_rate_is_a_429_with_retry_after_for_that_agent_only(
    client_for: Callable[..., Awaitable[httpx.AsyncClient]],
) -> None:
    # A rate so low that no token comes back during the test: the burst is all the agent has.
    client = await client_for(**{env.QUOTA_REQUESTS_PER_SECOND: "0.01", env.QUOTA_BURST: "3"})
    for _ in range(3):
        assert (await client.get("/v1/conversations/c/entries", headers=A)).status_code == 200
    limited = await client.get("/v1/conversations/c/entries", headers=A)
    assert limited.status_code == 429 and limited.json()["error"]["type"] == "rate_limited"
    assert int(limited.headers["retry-after"]) >= 1
    assert (await append(client, A, "c")).status_code == 429
    assert (await client.get("/v1/conversations/c/entries", headers=B)).status_code == 200


async def test_the_bucket_refills_at_the_agent_rate() -> None:
    now = [0.0]
    limits = QuotaLimits(max_conversations=10, max_bytes=10, requests_per_second=2.0, burst=2)
    quotas = Quotas(DefaultLimits(limits), None, clock=lambda: now[0])
    owner = Owner("team-a", "agent")
    await quotas.admit("get", owner, "mem:team-a/agent:c")
    await quotas.admit("get", owner, "mem:team-a/agent:c")
    with pytest.raises(RateLimited):
        await quotas.admit("get", owner, "mem:team-a/agent:c")
    now[0] = 0.5  # one token back at 2/s
    await quotas.admit("get", owner, "mem:team-a/agent:c")
    with pytest.raises(RateLimited):
        await quotas.admit("get", owner, "mem:team-a/agent:c")


async def test_a_body_over_the_transfer_rate_is_refused_before_it_is_read(
    client_for: Callable[..., Awaitable[httpx.AsyncClient]], valkey_server: ValkeyProcess
) -> None:
    """The burst is two maximal bodies; at a rate that gives nothing back during the test, appends of
    ~3/8 of the burst each pass until the bucket is in debt, then are a 429, for that agent only. Refused
    before it is read: a request that declares a body and sends none is answered at once instead of
    waiting out the body timeout."""
    client = await client_for(**{env.QUOTA_BYTES_PER_SECOND: "1", env.BODY_TIMEOUT_SECONDS: "30"})
    statuses = []
    for i in range(4):
        answer = await client.post(f"/v1/conversations/big{i}/entries", json=large_body(), headers=A)
        statuses.append(answer.status_code)
    assert statuses == [200, 200, 200, 429]
    assert "transfer rate" in answer.json()["error"]["message"] and int(answer.headers["retry-after"]) >= 1
    assert (await client.post("/v1/conversations/big3/entries", json=large_body(), headers=B)).status_code == 200
    assert valkey_server.client().llen("mem:team-a/greedy:big3") == 0

    # A raw socket: an HTTP client sends the whole body before it reads an answer.
    reader, writer = await asyncio.open_connection(client.base_url.host, client.base_url.port)
    head = f"POST /v1/conversations/c/entries HTTP/1.1\r\nhost: proxy\r\nauthorization: {A['Authorization']}\r\n"
    writer.write(f"{head}content-type: application/json\r\ncontent-length: 1000\r\n\r\n".encode())
    status_line = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    assert status_line.split()[1] == b"429"


async def test_refused_bodies_are_charged_to_the_agent_that_sent_them(
    client_for: Callable[..., Awaitable[httpx.AsyncClient]],
) -> None:
    """A body over the size limit is read and dropped (so the client can read its 413): those bytes cost
    the proxy all the same, so they count against the sender's transfer rate. The burst is two maximal
    bodies: two oversize ones spend it, the third attempt is refused before it is read; others are not."""
    client = await client_for(**{env.QUOTA_BYTES_PER_SECOND: "1"})
    oversize = b'{"entries":[' + b" " * env.MAX_BODY_BYTES + b"]}"
    headers = {**A, "content-type": "application/json"}
    statuses = [
        (await client.post("/v1/conversations/c/entries", content=oversize, headers=headers)).status_code
        for _ in range(3)
    ]
    assert statuses == [413, 413, 429]
    assert (await append(client, B, "c")).status_code == 200


async def test_reads_are_charged_by_what_they_return(client_for: Callable[..., Awaitable[httpx.AsyncClient]]) -> None:
    client = await client_for(**{env.QUOTA_BYTES_PER_SECOND: "1"})
    assert (await client.post("/v1/conversations/c/entries", json=large_body(), headers=B)).status_code == 200
    # The rest of the burst is spent on reads of what B stored, then B is refused; A is not.
    statuses = [(await client.get("/v1/conversations/c/entries", headers=B)).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert (await client.get("/v1/conversations/c/entries", headers=A)).status_code == 200


async def test_an_export_is_paced_by_the_transfer_rate_and_streams_are_bounded() -> None:
    now = [0.0]
    limits = QuotaLimits(10, 10, 1000.0, 1000, bytes_per_second=1_000_000.0)
    quotas = Quotas(DefaultLimits(limits), None, clock=lambda: now[0])
    owner = Owner("team-a", "agent")
    await quotas.admit("export", owner, "mem:team-a/agent:c")  # opens the agent's transfer bucket
    await quotas.pace(owner, int(limits.bytes_burst))  # spends the burst: no wait yet
    loop = asyncio.get_running_loop()
    started = loop.time()
    await quotas.pace(owner, 100_000)  # 0.1 s of debt at 1 MB/s
    assert loop.time() - started >= 0.09
    with pytest.raises(RateLimited):
        await quotas.admit("get", owner, "mem:team-a/agent:c")  # still in debt: the clock did not move
    now[0] = 1.0
    await quotas.admit("get", owner, "mem:team-a/agent:c")

    ends = [quotas.open_stream(owner) for _ in range(2)]
    with pytest.raises(RateLimited):
        quotas.open_stream(owner)
    quotas.open_stream(Owner("team-b", "other"))()  # other agents are not counted against it
    ends[0]()
    ends[0]()  # ending twice counts once
    ends.append(quotas.open_stream(owner))
    with pytest.raises(RateLimited):
        quotas.open_stream(owner)


def test_an_agent_deployment_overrides_the_defaults_field_by_field() -> None:
    defaults = QuotaLimits(max_conversations=100, max_bytes=1000, requests_per_second=200.0, burst=400)
    assert defaults.overridden(None) == defaults
    assert defaults.overridden({"maxConversations": 5}) == QuotaLimits(5, 1000, 200.0, 400)
    assert defaults.overridden({"maxBytes": 10, "requestsPerSecond": 3}) == QuotaLimits(100, 10, 3.0, 6)
    assert defaults.overridden({"bytesPerSecond": 5}).bytes_per_second == 5.0
    # Nonsense in an object the proxy did not validate falls back to the defaults.
    assert defaults.overridden({"maxBytes": -1, "requestsPerSecond": "x", "maxConversations": True}) == defaults


async def test_a_counted_write_without_its_quota_fails_closed(valkey_server: ValkeyProcess) -> None:
    """The storage quota reaches the store as an argument: a store that accounts its writes refuses a write
    handed no quota (never writing it unlimited), and refuses one over the quota it is handed."""
    from sessionmem_proxy.store import NewEntry

    valkey = connect(valkey_server.url, 2.0)
    try:
        store = ConversationStore(valkey, UsageLedger(valkey))
        key = "mem:team-a/closed:c1"
        with pytest.raises(TypeError):
            await store.append(key, [NewEntry("user", "hi")], "team-a/closed", cap=10, ttl_seconds=60)
        assert (await store.read(key, 10)).raw_entries == []
        quota = QuotaLimits(max_conversations=1, max_bytes=1 << 20, requests_per_second=10.0, burst=10)
        await store.append(key, [NewEntry("user", "hi")], "team-a/closed", cap=10, ttl_seconds=60, quota=quota)
        with pytest.raises(QuotaExceeded):
            await store.append(
                "mem:team-a/closed:c2", [NewEntry("user", "hi")], "team-a/closed", cap=10, ttl_seconds=60, quota=quota
            )
    finally:
        await valkey.aclose()
