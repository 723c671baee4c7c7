"""Compaction against a real valkey-server, both accounting styles: a summary recorded over the entries up to
a version, the entries kept; a read with summary=true answers the summary and what came after, an export
everything kept, and the summary leaves with the conversation or a replace."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner, catalogue_keys, session_key, usage_keys
from sessionmem_launcher.replay import history_from
from tests.support.store_variants import STORE_VARIANTS, proxy_client
from tests.support.valkey import ValkeyProcess

OWNER = Owner(namespace="team-a", agent="support-agent")
AUTH = {"Authorization": f"Bearer {dev_token(OWNER.namespace, OWNER.agent)}"}
SUMMARY = {
    "role": "system",
    "content": "The user planned a trip to Lisbon.",
    "id": "sum-1",
    "item": {"type": "compaction", "covers": [1, 2]},
}


@pytest.fixture(params=STORE_VARIANTS)
async def client(
    request: pytest.FixtureRequest, valkey_server: ValkeyProcess, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    """ "sealed": with encryption at rest (the summaries sealed too), every answer the same."""
    async with proxy_client(request.param, valkey_server.url, tmp_path, AUTH) as served:
        yield served


async def _turns(client: httpx.AsyncClient, conversation: str, count: int) -> None:
    for turn in range(1, count + 1):
        body = {
            "entries": [
                {"role": "user", "content": f"question {turn}", "id": f"u{turn}"},
                {"role": "assistant", "content": f"answer {turn}", "id": f"a{turn}"},
            ]
        }
        assert (await client.post(f"/v1/conversations/{conversation}/entries", json=body)).status_code == 200


def _accounting(valkey_server: ValkeyProcess, conversation: str) -> tuple[int, int, bytes | None]:
    """(bytes counted, bytes the list holds, the summary as stored)."""
    sync: Any = valkey_server.client()  # its hget is untyped in tests.support
    key = session_key(OWNER, conversation)
    held = sum(len(raw) for raw in sync.lrange(key, 0, -1))
    counted = int(sync.hget(usage_keys(OWNER.author)[1], key) or 0)
    return counted, held, sync.hget(catalogue_keys(key)[1], key)


async def test_a_summary_replaces_what_it_covers_in_replay_and_the_transcript_is_kept(
    client: httpx.AsyncClient, valkey_server: ValkeyProcess
) -> None:
    await _turns(client, "c", 3)
    compacted = await client.post("/v1/conversations/c/compact", json={"summary": SUMMARY, "throughVersion": 2})
    assert compacted.json() == {"version": 3, "scope": "session"}, compacted.text
    replay = orjson.loads((await client.get("/v1/conversations/c/entries", params={"summary": "true"})).content)
    assert (replay["summary"]["content"], replay["summary"]["v"]) == (SUMMARY["content"], 2)
    assert orjson.dumps(replay["summary"]["item"]) == orjson.dumps(SUMMARY["item"])
    assert [e["id"] for e in replay["entries"]] == ["u3", "a3"]
    assert replay["version"] == 3
    plain = (await client.get("/v1/conversations/c/entries")).json()
    assert [e["id"] for e in plain["entries"]] == ["u1", "a1", "u2", "a2", "u3", "a3"] and "summary" not in plain
    exported = (await client.get("/v1/conversations/c/export")).json()
    assert len(exported["entries"]) == 6 and exported["summary"]["id"] == "sum-1"
    # The managed loop's replay: the summary first, then the turn after it.
    summary, window = history_from(replay)
    assert summary is not None and SUMMARY["content"] in summary["content"]
    assert [m["content"] for m in window] == ["question 3", "answer 3"]
    counted, held, stored = _accounting(valkey_server, "c")
    assert stored is not None and counted == held + len(stored)


async def test_a_later_compaction_replaces_the_summary(client: httpx.AsyncClient) -> None:
    await _turns(client, "again", 4)
    await client.post("/v1/conversations/again/compact", json={"summary": SUMMARY, "throughVersion": 1})
    newer = {**SUMMARY, "content": "Lisbon, then Porto.", "id": "sum-2"}
    await client.post("/v1/conversations/again/compact", json={"summary": newer, "throughVersion": 3})
    replay = (await client.get("/v1/conversations/again/entries", params={"summary": "true"})).json()
    assert replay["summary"]["id"] == "sum-2" and [e["id"] for e in replay["entries"]] == ["u4", "a4"]


async def test_compaction_is_refused_past_the_version_or_without_a_conversation(client: httpx.AsyncClient) -> None:
    await _turns(client, "short", 1)
    ahead = await client.post("/v1/conversations/short/compact", json={"summary": SUMMARY, "throughVersion": 5})
    assert ahead.status_code == 400 and "throughVersion" in ahead.json()["error"]["message"]
    missing = await client.post("/v1/conversations/none/compact", json={"summary": SUMMARY, "throughVersion": 0})
    assert missing.status_code == 404


async def test_the_summary_leaves_with_a_replace_or_a_delete(
    client: httpx.AsyncClient, valkey_server: ValkeyProcess
) -> None:
    for conversation in ("replaced", "deleted"):
        await _turns(client, conversation, 2)
        await client.post(f"/v1/conversations/{conversation}/compact", json={"summary": SUMMARY, "throughVersion": 1})
    await client.put("/v1/conversations/replaced", json={"entries": [{"role": "user", "content": "fresh"}]})
    await client.delete("/v1/conversations/deleted")
    replay = (await client.get("/v1/conversations/replaced/entries", params={"summary": "true"})).json()
    assert replay.get("summary") is None and [e["content"] for e in replay["entries"]] == ["fresh"]
    counted, held, stored = _accounting(valkey_server, "replaced")
    assert stored is None and counted == held
    assert _accounting(valkey_server, "deleted") == (0, 0, None)


async def test_the_summary_is_redacted_like_any_entry(client: httpx.AsyncClient, valkey_server: ValkeyProcess) -> None:
    await _turns(client, "red", 1)
    summary = {"role": "system", "content": "mail bob@example.com", "item": {"note": "bob@example.com"}}
    await client.post("/v1/conversations/red/compact?redact=email", json={"summary": summary, "throughVersion": 1})
    _, _, stored = _accounting(valkey_server, "red")
    assert stored is not None and b"bob@example.com" not in stored
    # What the proxy answers of it (opened, when sealed) is the redacted summary.
    answered = (await client.get("/v1/conversations/red/entries?summary=true")).json()["summary"]
    assert answered["content"] == "mail [redacted:email]" and answered["item"] == {"note": "[redacted:email]"}
