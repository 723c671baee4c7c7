"""Conditional reads against a real valkey-server, in every store variant (one script, Cluster-style calls,
sealed): a read or an export answers an ETag, and the same read sent back with it in If-None-Match is a 304
without a body while nothing changed; any write (an append, a pop, a rewind, a replace), a compaction for
the answers that carry its summary, and above all a conversation erased and created again up to the same
version make it a full answer. An append asked for its representation answers its stored entries and the
ETag right after it, which the next read then matches."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import orjson

from sessionmem_core import api
from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner
from tests.support.store_variants import agent_client  # noqa: F401  (the suite's client fixture)

OWNER = Owner(namespace="team-a", agent="support-agent")
AUTH = {"Authorization": f"Bearer {dev_token(OWNER.namespace, OWNER.agent)}"}
OTHER = {"Authorization": f"Bearer {dev_token(OWNER.namespace, 'other-agent')}"}
READ = "/v1/conversations/c/entries?limit=40"


async def _append(client: httpx.AsyncClient, *contents: str, conversation: str = "c") -> httpx.Response:
    body = {"entries": [{"role": "user", "content": c, "id": c} for c in contents]}
    response = await client.post(f"/v1/conversations/{conversation}/entries", json=body)
    assert response.status_code == 200, response.text
    return response


async def _read(client: httpx.AsyncClient, etag: str | None = None, url: str = READ) -> httpx.Response:
    response = await client.get(url, headers={} if etag is None else {"If-None-Match": etag})
    assert response.status_code in (200, 304), response.text
    return response


async def test_an_unchanged_read_is_a_304_without_a_body(client: httpx.AsyncClient) -> None:
    await _append(client, "a", "b")
    first = await _read(client)
    etag = first.headers["etag"]
    again = await _read(client, etag)
    assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", etag)
    assert "content-type" not in again.headers
    # Another read's parameters are another answer: the same tag is current for it too (same state), and a
    # tag that is not one (a list, a weak tag, '*') is never met.
    assert (await _read(client, etag, "/v1/conversations/c/entries?limit=1")).status_code == 304
    for other in ("*", f"W/{etag}", f"{etag}, {etag}", '"x.1"'):
        assert (await _read(client, other)).status_code == 200


async def test_every_write_makes_the_next_read_a_full_answer(client: httpx.AsyncClient) -> None:
    await _append(client, "a", "b", "c")
    etag = (await _read(client)).headers["etag"]
    writes: list[Callable[[], Awaitable[httpx.Response]]] = [
        lambda: _append(client, "d"),
        lambda: client.post("/v1/conversations/c/pop"),
        lambda: _append(client, "e"),
        lambda: client.post("/v1/conversations/c/rewind", json={"toVersion": 1}),
        lambda: client.put("/v1/conversations/c", json={"entries": [{"role": "user", "content": "new"}]}),
    ]
    for write in writes:
        assert (await write()).status_code == 200
        answer = await _read(client, etag)
        assert answer.status_code == 200 and answer.headers["etag"] != etag
        etag = answer.headers["etag"]
        assert (await _read(client, etag)).status_code == 304


async def test_erased_and_created_again_at_the_same_version_never_matches(client: httpx.AsyncClient) -> None:
    await _append(client, "a")
    await _append(client, "b")
    before = await _read(client)
    assert before.json()["version"] == 2
    assert (await client.delete("/v1/conversations/c")).status_code == 200
    await _append(client, "a")
    await _append(client, "b")  # the same ids, contents and version as before the erasure
    after = await _read(client, before.headers["etag"])
    assert after.status_code == 200 and after.json()["version"] == 2
    assert after.headers["etag"] != before.headers["etag"]
    # Emptied by pops and created again: the same.
    for _ in range(2):
        await client.post("/v1/conversations/c/pop")
    await _append(client, "a")
    await _append(client, "b")
    assert (await _read(client, after.headers["etag"])).status_code == 200


async def test_a_tag_of_one_agents_conversation_is_never_current_for_anothers(client: httpx.AsyncClient) -> None:
    await _append(client, "a")
    mine = (await _read(client)).headers["etag"]
    theirs = await client.post(
        "/v1/conversations/c/entries", json={"entries": [{"role": "user", "content": "a", "id": "a"}]}, headers=OTHER
    )
    assert theirs.status_code == 200
    answer = await client.get(READ, headers={**OTHER, "If-None-Match": mine})
    assert answer.status_code == 200 and answer.headers["etag"] != mine
    # An empty conversation answers like any other empty one: nothing of anyone's is in it.
    empty = await _read(client, url="/v1/conversations/nobody/entries")
    assert empty.json()["entries"] == []
    assert (await _read(client, empty.headers["etag"], "/v1/conversations/nobody/entries")).status_code == 304


async def test_an_append_with_its_representation_answers_the_state_right_after_it(
    client: httpx.AsyncClient,
) -> None:
    await _append(client, "a")
    plain = await _append(client, "b")
    assert "entries" not in plain.json() and "etag" not in plain.headers
    asked = await client.post(
        "/v1/conversations/c/entries",
        json={"entries": [{"role": "user", "content": "c"}, {"role": "tool", "content": "", "item": {"k": [1]}}]},
        headers={"Prefer": api.RETURN_REPRESENTATION, "Idempotency-Key": "k-1"},
    )
    assert asked.status_code == 200, asked.text
    read = await _read(client)
    # What it answers is what a read answers of those entries, byte for byte, and the read's tag.
    assert orjson.dumps(asked.json()["entries"]) == orjson.dumps(read.json()["entries"][-2:])
    assert asked.headers["etag"] == read.headers["etag"]
    assert (await _read(client, asked.headers["etag"])).status_code == 304
    # A retry stores nothing and so answers no entries and no tag.
    retried = await client.post(
        "/v1/conversations/c/entries",
        json={"entries": [{"role": "user", "content": "c"}]},
        headers={"Prefer": api.RETURN_REPRESENTATION, "Idempotency-Key": "k-1"},
    )
    assert retried.json()["duplicate"] and "entries" not in retried.json() and "etag" not in retried.headers


async def test_an_export_is_conditional_and_its_tag_follows_the_summary(client: httpx.AsyncClient) -> None:
    await _append(client, "a", "b")
    export = "/v1/conversations/c/export"
    first = await _read(client, url=export)
    etag = first.headers["etag"]
    assert (await _read(client, etag, export)).status_code == 304
    compacted = await client.post(
        "/v1/conversations/c/compact", json={"summary": {"role": "system", "content": "s"}, "throughVersion": 1}
    )
    if compacted.status_code == 200:  # a store with a catalogue: the export now answers the summary
        assert compacted.json()["version"] == first.json()["version"]
        changed = await _read(client, etag, export)
        assert changed.status_code == 200 and changed.json()["summary"]["content"] == "s"
        etag = changed.headers["etag"]
        assert (await _read(client, etag, export)).status_code == 304
    await _append(client, "c")
    assert (await _read(client, etag, export)).status_code == 200
    # A read with the summary has no tag (a compaction does not move the version).
    assert "etag" not in (await _read(client, url=READ + "&summary=true")).headers
