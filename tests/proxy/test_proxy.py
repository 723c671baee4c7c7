"""The proxy against a real valkey-server: atomic appends, cap, TTL, versions, typed errors."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest

from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner, session_key, shared_key
from tests.support.conversations import BAD_IDS, exchange
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess

OWNER = Owner(namespace="team-a", agent="support-agent")
AUTH = {"Authorization": f"Bearer {dev_token(OWNER.namespace, OWNER.agent)}"}


async def test_64_concurrent_writers_never_interleave_and_keep_the_last_500(
    proxy_process: ServiceProcess, valkey_server: ValkeyProcess
) -> None:
    writers, appends_each = 64, 50
    limits = httpx.Limits(max_connections=writers)
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH, limits=limits, timeout=30) as client:

        async def writer(w: int) -> list[int]:
            versions = []
            for i in range(appends_each):
                body = exchange(f"w{w}-{i}", user=f"user {w}/{i}", assistant=f"assistant {w}/{i}")
                response = await client.post("/v1/conversations/race/entries", json=body)
                assert response.status_code == 200, response.text
                versions.append(response.json()["version"])
            return versions

        results = await asyncio.gather(*(writer(w) for w in range(writers)))

    total = writers * appends_each
    all_versions = sorted(v for versions in results for v in versions)
    assert all_versions == list(range(1, total + 1)), "the version moves exactly once per append"

    raw = valkey_server.client().lrange(session_key(OWNER, "race"), 0, -1)
    assert len(raw) == 500
    entries = [orjson.loads(r) for r in raw]
    assert entries[-1]["v"] == total
    for user, assistant in zip(entries[0::2], entries[1::2], strict=True):
        assert user["role"] == "user" and assistant["role"] == "assistant"
        assert user["id"].removesuffix("-u") == assistant["id"].removesuffix("-a")
        assert user["v"] == assistant["v"]
        assert user["author"] == "team-a/support-agent"
    kept_versions = [e["v"] for e in entries[0::2]]
    assert kept_versions == list(range(total - 249, total + 1)), "exactly the last 250 exchanges are kept"


async def test_a_retried_append_is_stored_once(proxy_process: ServiceProcess, valkey_server: ValkeyProcess) -> None:
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        first = await client.post("/v1/conversations/retry/entries", json=exchange("t1"))
        await client.post("/v1/conversations/retry/entries", json=exchange("t2"))
        again = await client.post("/v1/conversations/retry/entries", json=exchange("t1"))
        history = (await client.get("/v1/conversations/retry/entries")).json()
    assert first.json() == {
        "version": 1,
        "stored": 2,
        "duplicate": False,
        "scope": "session",
        "length": 2,
        "duplicateIds": [],
    }
    assert again.json() == {
        "version": 2,
        "stored": 0,
        "duplicate": True,
        "scope": "session",
        "length": 4,
        "duplicateIds": ["t1-u", "t1-a"],
    }
    assert [e["id"] for e in history["entries"]] == ["t1-u", "t1-a", "t2-u", "t2-a"]
    assert history["version"] == 2


async def test_ttl_is_set_and_refreshed_by_writes_not_by_reads(
    proxy_process: ServiceProcess, valkey_server: ValkeyProcess
) -> None:
    key = session_key(OWNER, "ttl")
    valkey = valkey_server.client()
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        await client.post("/v1/conversations/ttl/entries?ttlSeconds=3", json=exchange("a"))
        assert 2500 < valkey.pttl(key) <= 3000
        time.sleep(1.2)
        assert (await client.get("/v1/conversations/ttl/entries")).status_code == 200
        after_read = valkey.pttl(key)
        assert 0 < after_read <= 1900, "a read does not refresh the TTL"
        await client.post("/v1/conversations/ttl/entries?ttlSeconds=3", json=exchange("b"))
        assert valkey.pttl(key) > 2500, "a write refreshes the TTL"
        time.sleep(3.2)
        gone = (await client.get("/v1/conversations/ttl/entries")).json()
    assert gone["entries"] == [] and gone["version"] == 0


async def test_cap_holds_at_500_and_the_version_still_moves(
    proxy_process: ServiceProcess, valkey_server: ValkeyProcess
) -> None:
    key = session_key(OWNER, "cap")
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        for i in range(260):
            assert (await client.post("/v1/conversations/cap/entries", json=exchange(f"c{i}"))).status_code == 200
        assert valkey_server.client().llen(key) == 500
        before = (await client.get("/v1/conversations/cap/entries?limit=0")).json()["version"]
        after = (await client.post("/v1/conversations/cap/entries", json=exchange("last"))).json()["version"]
        history = (await client.get("/v1/conversations/cap/entries?limit=2")).json()
    assert before == 260 and after == 261
    assert valkey_server.client().llen(key) == 500
    assert [e["id"] for e in history["entries"]] == ["last-u", "last-a"]


@pytest.mark.parametrize("bad_id", BAD_IDS.values(), ids=BAD_IDS.keys())
async def test_every_bad_conversation_id_is_a_typed_400(proxy_process: ServiceProcess, bad_id: str) -> None:
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        for method, path in (
            ("GET", f"/v1/conversations/{bad_id}/entries"),
            ("POST", f"/v1/conversations/{bad_id}/entries"),
            ("DELETE", f"/v1/conversations/{bad_id}"),
        ):
            body = orjson.dumps(exchange("x")) if method == "POST" else None
            response = await client.request(method, path, content=body, headers={"content-type": "application/json"})
            assert response.status_code == 400, (method, path, response.text)
            assert response.json()["error"]["type"] == "invalid_conversation_id"


async def test_body_over_one_mebibyte_is_413(proxy_process: ServiceProcess) -> None:
    big = {"entries": [{"role": "user", "content": "x" * (1024 * 1024)}]}
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        response = await client.post("/v1/conversations/big/entries", json=big)
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "payload_too_large"


async def test_bad_bodies_and_missing_credentials_are_typed(proxy_process: ServiceProcess) -> None:
    async with httpx.AsyncClient(base_url=proxy_process.base_url) as client:
        no_token = await client.get("/v1/conversations/c1/entries")
        bad_role = await client.post(
            "/v1/conversations/c1/entries", json={"entries": [{"role": "to ol", "content": "x"}]}, headers=AUTH
        )
        empty = await client.post("/v1/conversations/c1/entries", json={"entries": []}, headers=AUTH)
        not_json = await client.post(
            "/v1/conversations/c1/entries", content=b"{", headers={**AUTH, "content-type": "application/json"}
        )
        non_agent = await client.get("/v1/conversations/c1/entries", headers={"Authorization": "Bearer dev:nobody"})
    assert no_token.status_code == 401 and no_token.json()["error"]["type"] == "unauthenticated"
    for response in (bad_role, empty, not_json):
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request"
    assert non_agent.status_code == 403


async def test_replace_is_conditional_on_the_version(proxy_process: ServiceProcess) -> None:
    seed = {"entries": [{"role": "system", "content": "seeded"}]}
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        await client.post("/v1/conversations/seed/entries", json=exchange("a"))
        stale = await client.put("/v1/conversations/seed", json=seed, headers={"If-Match": "7"})
        fresh = await client.put("/v1/conversations/seed", json=seed, headers={"If-Match": "1"})
        history = (await client.get("/v1/conversations/seed/entries")).json()
    assert stale.status_code == 412 and stale.json()["error"]["type"] == "version_conflict"
    assert fresh.status_code == 200 and fresh.json()["version"] == 2
    assert [e["content"] for e in history["entries"]] == ["seeded"] and history["version"] == 2


async def test_delete_search_and_shared_scope(proxy_process: ServiceProcess, valkey_server: ValkeyProcess) -> None:
    member = {"Authorization": f"Bearer {dev_token('team-a', 'support-agent', registry='helpdesk')}"}
    other_member = {"Authorization": f"Bearer {dev_token('team-b', 'billing-agent', registry='helpdesk')}"}
    async with httpx.AsyncClient(base_url=proxy_process.base_url) as client:
        await client.post("/v1/conversations/s1/entries", json=exchange("a", user="my invoice is late"), headers=AUTH)
        await client.post("/v1/conversations/s1/entries", json=exchange("b", user="weather today"), headers=AUTH)
        found = (await client.get("/v1/conversations/s1/search?q=invoice", headers=AUTH)).json()
        shared_write = await client.post(
            "/v1/conversations/s1/entries?scope=shared", json=exchange("c"), headers=member
        )
        shared_read = await client.get("/v1/conversations/s1/entries?scope=shared", headers=other_member)
        non_member = await client.get("/v1/conversations/s1/entries?scope=shared", headers=AUTH)
        deleted = (await client.delete("/v1/conversations/s1", headers=AUTH)).json()
    assert [m["content"] for m in found["matches"]] == ["my invoice is late"]
    assert shared_write.json()["scope"] == "shared"
    shared = shared_read.json()
    assert shared["scope"] == "shared" and [e["author"] for e in shared["entries"]] == ["team-a/support-agent"] * 2
    assert valkey_server.client().exists(shared_key("helpdesk", "s1"))
    assert non_member.json()["scope"] == "session", "a non-member asking for shared keeps its private layout"
    assert deleted == {"deleted": True, "entries": 4, "scope": "session"}


async def test_valkey_down_is_a_typed_503_and_recovers(
    proxy_process: ServiceProcess, valkey_server: ValkeyProcess
) -> None:
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH, timeout=10) as client:
        assert (await client.post("/v1/conversations/down/entries", json=exchange("a"))).status_code == 200
        valkey_server.stop()
        started = time.monotonic()
        down = await client.get("/v1/conversations/down/entries")
        assert time.monotonic() - started < 2
        assert down.status_code == 503 and down.json()["error"]["type"] == "backend_unavailable"
        assert (await client.get("/readyz")).status_code == 503
        valkey_server.start()
        back = await client.post("/v1/conversations/down/entries", json=exchange("b"))
    assert back.status_code == 200


async def test_limits_that_protect_valkey_are_typed(proxy_process: ServiceProcess) -> None:
    too_many = {"entries": [{"role": "user", "content": "x"}] * 65}
    too_long = {"entries": [{"role": "user", "content": "x" * (256 * 1024 + 1)}]}
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        many = await client.post("/v1/conversations/limits/entries", json=too_many)
        long = await client.post("/v1/conversations/limits/entries", json=too_long)
        big_cap = await client.post("/v1/conversations/limits/entries?cap=10001", json=exchange("a"))
        big_read = await client.get("/v1/conversations/limits/entries?limit=501")
        nothing = await client.get("/v1/conversations/limits/entries")
    for response in (many, long, big_cap, big_read):
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request", response.text
    assert nothing.json()["entries"] == [], "nothing of a refused write was stored"
