"""The catalogue against a real valkey-server, with the accounting in the write's own script (standalone
Valkey) and in separate calls (a Valkey Cluster): conversations listed newest write first with a cursor,
their metadata, per agent and per user bucket, kept by the writes themselves and expiring with them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessionmem_core import api, env
from sessionmem_core.capability import mint_capability, new_key
from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner
from tests.support.store_variants import STORE_VARIANTS, UNTHROTTLED, proxy_client
from tests.support.valkey import ValkeyProcess

OWNER = Owner(namespace="team-a", agent="support-agent")
AUTH = {"Authorization": f"Bearer {dev_token(OWNER.namespace, OWNER.agent)}"}
KEY = new_key()


def as_user(user: str) -> dict[str, str]:
    return {api.USER_CAPABILITY_HEADER: mint_capability(KEY, user, OWNER, 600)}


@pytest.fixture(params=STORE_VARIANTS)
async def client(
    request: pytest.FixtureRequest, valkey_server: ValkeyProcess, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    """ "sealed": with encryption at rest (titles and labels sealed too), every answer the same."""
    (tmp_path / "key").write_bytes(KEY)
    async with proxy_client(
        request.param,
        valkey_server.url,
        tmp_path,
        AUTH,
        **{
            env.CAPABILITY_KEY_FILE: str(tmp_path / "key"),
            **UNTHROTTLED,
        },
    ) as served:
        yield served


async def _write(client: httpx.AsyncClient, conversation: str, headers: dict[str, str] | None = None, **q: Any) -> None:
    response = await client.post(
        f"/v1/conversations/{conversation}/entries",
        params=q,
        json={"entries": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        headers=headers or {},
    )
    assert response.status_code == 200, response.text
    await asyncio.sleep(0.002)  # distinct write times, so the order is the writes'


async def _all(client: httpx.AsyncClient, limit: int, headers: dict[str, str] | None = None) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = "0"
    while True:
        page = await client.get("/v1/conversations", params={"limit": limit, "cursor": cursor}, headers=headers or {})
        assert page.status_code == 200, page.text
        body = page.json()
        pages.append([c["conversationId"] for c in body["conversations"]])
        if body["nextCursor"] is None:
            return pages
        cursor = body["nextCursor"]


async def test_conversations_are_listed_newest_write_first_a_page_at_a_time(client: httpx.AsyncClient) -> None:
    for n in range(7):
        await _write(client, f"c{n}")
    await _write(client, "c2")  # written again: now the newest
    assert await _all(client, 3) == [["c2", "c6", "c5"], ["c4", "c3", "c1"], ["c0"]]
    (first,) = (await client.get("/v1/conversations", params={"limit": 1})).json()["conversations"]
    assert first["entries"] == 4 and first["bucket"] is None
    assert first["created"] < first["updated"]


async def test_title_and_labels_are_set_kept_and_cleared(client: httpx.AsyncClient) -> None:
    await _write(client, "trip")
    set_both = await client.patch(
        "/v1/conversations/trip/metadata", json={"title": "Lisbon trip", "labels": {"team": "travel", "p": "1"}}
    )
    assert set_both.status_code == 200, set_both.text
    assert (set_both.json()["title"], set_both.json()["labels"]) == ("Lisbon trip", {"team": "travel", "p": "1"})
    only_title = (await client.patch("/v1/conversations/trip/metadata", json={"title": None})).json()
    assert (only_title["title"], only_title["labels"]) == (None, {"team": "travel", "p": "1"})
    (listed,) = (await client.get("/v1/conversations")).json()["conversations"]
    assert (listed["conversationId"], listed["labels"], listed["entries"]) == ("trip", {"team": "travel", "p": "1"}, 2)
    missing = await client.patch("/v1/conversations/never/metadata", json={"title": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"


async def test_what_leaves_memory_leaves_the_catalogue(client: httpx.AsyncClient) -> None:
    for name in ("kept", "deleted", "popped", "rewound", "short"):
        await _write(client, name)
    await client.patch("/v1/conversations/deleted/metadata", json={"title": "secret"})
    await client.delete("/v1/conversations/deleted")
    await client.post("/v1/conversations/popped/pop")
    await client.post("/v1/conversations/popped/pop")
    await client.post("/v1/conversations/rewound/rewind", json={"toVersion": 0})
    await _write(client, "short", ttlSeconds=1)
    await asyncio.sleep(1.3)
    assert await _all(client, 10) == [["kept"]]
    # The same id written again starts a new record: no title left from before.
    await _write(client, "deleted")
    listed = {c["conversationId"]: c for c in (await client.get("/v1/conversations")).json()["conversations"]}
    assert listed["deleted"]["title"] is None and listed["deleted"]["entries"] == 2


async def test_a_pop_updates_the_entries_listed(client: httpx.AsyncClient) -> None:
    await _write(client, "p")
    await client.post("/v1/conversations/p/pop")
    (listed,) = (await client.get("/v1/conversations")).json()["conversations"]
    assert listed["entries"] == 1


async def test_each_user_bucket_and_the_agent_have_their_own_catalogue(client: httpx.AsyncClient) -> None:
    await _write(client, "mine")
    await _write(client, "a1", as_user("alice"))
    await _write(client, "a2", as_user("alice"))
    await _write(client, "b1", as_user("bob"))
    alice = (await client.get("/v1/conversations", headers=as_user("alice"))).json()["conversations"]
    bob = (await client.get("/v1/conversations", headers=as_user("bob"))).json()["conversations"]
    assert [c["conversationId"] for c in alice] == ["a2", "a1"]
    assert [c["conversationId"] for c in bob] == ["b1"]
    assert alice[0]["bucket"] is not None and alice[0]["bucket"] != bob[0]["bucket"]
    assert await _all(client, 10) == [["mine"]]


async def test_a_cursor_that_is_not_one_is_a_typed_400(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/conversations", params={"cursor": "x"})
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request"
