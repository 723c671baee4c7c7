"""pop, conditional delete, rewind and fork against a real valkey-server, each with its accounting in the
write's own script (standalone Valkey) and in separate calls (what a Valkey Cluster needs): atomic,
conditional on the version (If-Match), and the version never going backwards."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson

from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner, session_key, usage_keys
from tests.support.items import SHAPES
from tests.support.store_variants import agent_client  # noqa: F401  (the suite's client fixture)
from tests.support.valkey import ValkeyProcess

OWNER = Owner(namespace="team-a", agent="support-agent")
AUTH = {"Authorization": f"Bearer {dev_token(OWNER.namespace, OWNER.agent)}"}


async def _append(client: httpx.AsyncClient, conversation: str, *contents: str) -> int:
    body = {"entries": [{"role": "user", "content": c, "id": c} for c in contents]}
    response = await client.post(f"/v1/conversations/{conversation}/entries", json=body)
    assert response.status_code == 200, response.text
    return int(response.json()["version"])


async def _ids(client: httpx.AsyncClient, conversation: str) -> tuple[int, list[str]]:
    history = (await client.get(f"/v1/conversations/{conversation}/entries?limit=500")).json()
    return history["version"], [e["id"] for e in history["entries"]]


def _stored_total(valkey_server: ValkeyProcess) -> tuple[int, int]:
    """(bytes the accounting counts for the agent, bytes its conversations hold)."""
    sync: Any = valkey_server.client()  # its hget is untyped in tests.support
    held = sum(len(raw) for key in sync.keys("mem:team-a/support-agent:*") for raw in sync.lrange(key, 0, -1))
    return int(sync.hget(usage_keys(OWNER.author)[1], "total") or 0), held


async def test_pop_removes_the_newest_entry_and_the_version_moves_on(
    client: httpx.AsyncClient, valkey_server: ValkeyProcess
) -> None:
    await _append(client, "p", "a")
    await _append(client, "p", "b", "c")
    popped = await client.post("/v1/conversations/p/pop", headers={"If-Match": "2"})
    assert popped.status_code == 200, popped.text
    answer = popped.json()
    assert (answer["entry"]["id"], answer["entry"]["v"], answer["version"], answer["length"]) == ("c", 2, 3, 2)
    assert await _ids(client, "p") == (3, ["a", "b"])
    # A pop is a write: the If-Match taken before it fails now, and the next append is at 4.
    stale = await client.post("/v1/conversations/p/pop", headers={"If-Match": "2"})
    assert stale.status_code == 412 and stale.json()["error"]["type"] == "version_conflict"
    assert await _append(client, "p", "d") == 4
    info = (await client.get("/v1/conversations/p")).json()
    assert (info["version"], info["entries"]) == (4, 3)
    counted, held = _stored_total(valkey_server)
    assert counted == held


async def test_popping_the_last_entry_removes_the_conversation_and_an_empty_pop_is_null(
    client: httpx.AsyncClient, valkey_server: ValkeyProcess
) -> None:
    await _append(client, "one", "a")
    assert (await client.post("/v1/conversations/one/pop")).json()["entry"]["id"] == "a"
    empty = (await client.post("/v1/conversations/one/pop")).json()
    assert empty == {"entry": None, "version": 0, "length": 0, "scope": "session"}
    assert valkey_server.client().exists(session_key(OWNER, "one")) == 0
    assert _stored_total(valkey_server) == (0, 0)


async def test_concurrent_pops_with_one_if_match_remove_exactly_one_entry(client: httpx.AsyncClient) -> None:
    version = await _append(client, "race", *(f"m{i}" for i in range(20)))
    answers = await asyncio.gather(
        *(client.post("/v1/conversations/race/pop", headers={"If-Match": str(version)}) for _ in range(16))
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] + [412] * 15
    assert len((await _ids(client, "race"))[1]) == 19


async def test_a_popped_item_comes_back_as_it_was_stored(client: httpx.AsyncClient) -> None:
    role, content, item = SHAPES["reasoning with encrypted content"]
    body = {"entries": [{"role": role, "content": content, "item": item, "id": "rs"}]}
    await client.post("/v1/conversations/item-pop/entries", json=body)
    popped = orjson.loads((await client.post("/v1/conversations/item-pop/pop")).content)
    assert orjson.dumps(popped["entry"]["item"]) == orjson.dumps(item)


async def _conditional_append(
    client: httpx.AsyncClient, conversation: str, content: str, if_match: str, key: str | None = None
) -> httpx.Response:
    headers = {"If-Match": if_match, **({"Idempotency-Key": key} if key else {})}
    body = {"entries": [{"role": "user", "content": content}]}
    return await client.post(f"/v1/conversations/{conversation}/entries", json=body, headers=headers)


async def test_an_append_is_conditional_on_the_version(client: httpx.AsyncClient, valkey_server: ValkeyProcess) -> None:
    created = await _conditional_append(client, "ca", "a", "0")  # only where nothing is stored yet
    assert (created.status_code, created.json()["version"]) == (200, 1), created.text
    again = await _conditional_append(client, "ca", "b", "0")
    assert again.status_code == 412 and again.json()["error"]["type"] == "version_conflict"
    assert (await _conditional_append(client, "ca", "c", '"1"')).json()["version"] == 2  # an entity tag's form
    stale = await _conditional_append(client, "ca", "d", "1")
    assert stale.status_code == 412, stale.text
    assert (await _conditional_append(client, "ca", "e", "*")).json()["version"] == 3
    assert (await _conditional_append(client, "ca", "f", "three")).status_code == 400
    # A pop moves the version on without an entry of its own: the version it answers is the one to expect.
    popped = (await client.post("/v1/conversations/ca/pop")).json()
    assert (await _conditional_append(client, "ca", "g", "3")).status_code == 412
    assert (await _conditional_append(client, "ca", "g", str(popped["version"]))).json()["version"] == 5
    history = (await client.get("/v1/conversations/ca/entries?limit=500")).json()
    assert [(e["content"], e["v"]) for e in history["entries"]] == [("a", 1), ("c", 2), ("g", 5)]
    counted, held = _stored_total(valkey_server)
    assert counted == held, "a refused append counts nothing"


async def test_a_retried_conditional_append_is_answered_as_its_original(client: httpx.AsyncClient) -> None:
    """Its Idempotency-Key is judged first: the retry of an append that was stored finds the version it
    expected gone (its own write moved it), and is still answered as the original was."""
    first = await _conditional_append(client, "retry", "a", "0", key="turn-1")
    retry = await _conditional_append(client, "retry", "a", "0", key="turn-1")
    other = await _conditional_append(client, "retry", "b", "0", key="turn-2")
    assert (first.json()["duplicate"], first.json()["version"]) == (False, 1)
    assert (retry.status_code, retry.json()["duplicate"], retry.json()["version"]) == (200, True, 1)
    assert other.status_code == 412
    assert (await _ids(client, "retry"))[0] == 1


async def test_concurrent_appends_with_one_if_match_store_exactly_one(client: httpx.AsyncClient) -> None:
    version = await _append(client, "writers", "seed")
    answers = await asyncio.gather(*(_conditional_append(client, "writers", f"w{i}", str(version)) for i in range(16)))
    assert sorted(a.status_code for a in answers) == [200] + [412] * 15
    (winner,) = [n for n, a in enumerate(answers) if a.status_code == 200]
    history = (await client.get("/v1/conversations/writers/entries?limit=500")).json()
    assert history["version"] == version + 1
    assert [e["content"] for e in history["entries"]] == ["seed", f"w{winner}"]


async def test_delete_is_conditional_on_the_version(client: httpx.AsyncClient) -> None:
    await _append(client, "del", "a")
    refused = await client.delete("/v1/conversations/del", headers={"If-Match": "7"})
    assert refused.status_code == 412 and refused.json()["error"]["type"] == "version_conflict"
    assert (await _ids(client, "del"))[1] == ["a"]
    deleted = await client.delete("/v1/conversations/del", headers={"If-Match": "1"})
    assert deleted.json() == {"deleted": True, "entries": 1, "scope": "session"}


async def test_rewind_drops_what_was_written_after_a_version(
    client: httpx.AsyncClient, valkey_server: ValkeyProcess
) -> None:
    for turn in range(1, 6):
        await _append(client, "rw", f"u{turn}", f"a{turn}")
    rewound = await client.post("/v1/conversations/rw/rewind", json={"toVersion": 2}, headers={"If-Match": "5"})
    assert rewound.json() == {"version": 6, "removed": 6, "length": 4, "scope": "session"}
    assert await _ids(client, "rw") == (6, ["u1", "a1", "u2", "a2"])
    stale = await client.post("/v1/conversations/rw/rewind", json={"toVersion": 1}, headers={"If-Match": "5"})
    assert stale.status_code == 412
    # Nothing written after the version: nothing removed, no write, the version stays.
    same = await client.post("/v1/conversations/rw/rewind", json={"toVersion": 2})
    assert same.json() == {"version": 6, "removed": 0, "length": 4, "scope": "session"}
    assert await _append(client, "rw", "u7") == 7
    counted, held = _stored_total(valkey_server)
    assert counted == held


async def test_rewinding_past_everything_removes_the_conversation(client: httpx.AsyncClient) -> None:
    await _append(client, "all", "a")
    answer = (await client.post("/v1/conversations/all/rewind", json={"toVersion": 0})).json()
    assert answer == {"version": 0, "removed": 1, "length": 0, "scope": "session"}
    assert (await client.get("/v1/conversations/all")).json()["exists"] is False


async def test_fork_copies_the_entries_written_up_to_a_version(
    client: httpx.AsyncClient, valkey_server: ValkeyProcess
) -> None:
    role, content, item = SHAPES["function call"]
    await _append(client, "src", "u1")
    await client.post(
        "/v1/conversations/src/entries", json={"entries": [{"role": role, "content": content, "item": item}]}
    )
    await _append(client, "src", "u3")
    forked = await client.post("/v1/conversations/src/fork", json={"conversationId": "branch", "atVersion": 2})
    assert forked.json() == {"conversationId": "branch", "version": 2, "entries": 2, "scope": "session"}
    source = orjson.loads((await client.get("/v1/conversations/src/entries")).content)["entries"]
    branch = orjson.loads((await client.get("/v1/conversations/branch/entries")).content)["entries"]
    # The copies as they are, but for the branch's own life id on its newest entry (its ETags are its own).
    assert [{k: v for k, v in e.items() if k != "life"} for e in branch] == [
        {k: v for k, v in e.items() if k != "life"} for e in source[:2]
    ]
    assert branch[-1]["life"] not in (None, source[1].get("life"), source[-1]["life"])
    # The branch goes its own way; the source is untouched.
    assert await _append(client, "branch", "b3") == 3
    assert (await _ids(client, "src"))[1][-1] == "u3"
    counted, held = _stored_total(valkey_server)
    assert counted == held


async def test_fork_of_a_popped_conversation_starts_at_what_it_copies(client: httpx.AsyncClient) -> None:
    await _append(client, "popped", "a")
    await _append(client, "popped", "b")
    await client.post("/v1/conversations/popped/pop")
    forked = (await client.post("/v1/conversations/popped/fork", json={"conversationId": "f"})).json()
    assert (forked["version"], forked["entries"]) == (1, 1)
    (entry,) = (await client.get("/v1/conversations/f/entries")).json()["entries"]
    assert "rewoundAt" not in entry


async def test_fork_onto_an_existing_conversation_is_a_409_and_changes_nothing(client: httpx.AsyncClient) -> None:
    await _append(client, "s", "a")
    await _append(client, "taken", "x")
    refused = await client.post("/v1/conversations/s/fork", json={"conversationId": "taken"})
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "conversation_exists"
    assert (await _ids(client, "taken"))[1] == ["x"]
    bad = await client.post("/v1/conversations/s/fork", json={"conversationId": "a:b"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_conversation_id"


async def test_a_retry_after_a_pop_is_still_recognised_by_its_idempotency_key(client: httpx.AsyncClient) -> None:
    url = "/v1/conversations/idem-pop/entries"
    one = {"entries": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}
    await client.post(url, json=one, headers={"Idempotency-Key": "t1"})
    await client.post(url, json=one, headers={"Idempotency-Key": "t2"})
    for _ in range(3):
        await client.post("/v1/conversations/idem-pop/pop")
    raw = (await client.get(url)).json()["entries"][0]
    assert list(raw)[:4] == ["id", "v", "rewoundAt", "idempotencyKey"], (
        "t1's first entry: the pop's stamp, then its key"
    )
    retried = (await client.post(url, json=one, headers={"Idempotency-Key": "t1"})).json()
    assert (retried["duplicate"], retried["version"]) == (True, 1)
