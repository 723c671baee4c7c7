"""Lossless entries against the real proxy and a real valkey-server: items stored and answered as given
(JSON-equal, key order kept), open roles, empty content, the caller's ids kept, the idempotency key,
redaction inside items and the per-entry limit."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from sessionmem_core import env
from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner, session_key, usage_keys
from tests.support.items import SHAPES
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess

OWNER = Owner(namespace="team-a", agent="support-agent")
AUTH = {"Authorization": f"Bearer {dev_token(OWNER.namespace, OWNER.agent)}"}


def _entries() -> list[dict[str, object]]:
    return [
        {"role": role, "content": content, "id": f"item-{n}", "item": item}
        for n, (role, content, item) in enumerate(SHAPES.values())
    ]


async def test_fifteen_item_shapes_round_trip_with_their_key_order(proxy_process: ServiceProcess) -> None:
    sent = _entries()
    assert len(sent) == 15
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        appended = await client.post("/v1/conversations/items/entries", json={"entries": sent})
        assert appended.status_code == 200, appended.text
        read = await client.get("/v1/conversations/items/entries?limit=500")
        exported = await client.get("/v1/conversations/items/export")
    for response in (read, exported):
        got = orjson.loads(response.content)["entries"]
        assert [(e["id"], e["role"], e["content"]) for e in got] == [(e["id"], e["role"], e["content"]) for e in sent]
        for entry, original in zip(got, sent, strict=True):
            # orjson keeps key order both ways: equal bytes mean equal values in the same order.
            assert orjson.dumps(entry["item"]) == orjson.dumps(original["item"]), entry["id"]


async def test_an_entry_without_an_item_answers_none_and_keeps_its_shape(proxy_process: ServiceProcess) -> None:
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        await client.post(
            "/v1/conversations/plain/entries", json={"entries": [{"role": "tool", "content": "", "id": "t"}]}
        )
        (entry,) = (await client.get("/v1/conversations/plain/entries")).json()["entries"]
    # The newest entry carries the conversation's life id (its ETag's) after its id and version.
    assert list(entry) == ["id", "v", "life", "role", "content", "author", "ts"]
    assert (entry["role"], entry["content"]) == ("tool", "")


async def test_the_callers_ids_are_kept_and_may_repeat_under_an_idempotency_key(
    proxy_process: ServiceProcess,
) -> None:
    batch = {
        "entries": [{"role": "user", "content": "a", "id": "same"}, {"role": "user", "content": "b", "id": "same"}]
    }
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        first = await client.post("/v1/conversations/idem/entries", json=batch, headers={"Idempotency-Key": "k-1"})
        second = await client.post("/v1/conversations/idem/entries", json=batch, headers={"Idempotency-Key": "k-2"})
        history = (await client.get("/v1/conversations/idem/entries")).json()
    assert (first.json()["stored"], second.json()["stored"]) == (2, 2)
    assert [e["id"] for e in history["entries"]] == ["same"] * 4
    assert [e.get("idempotencyKey") for e in history["entries"]] == ["k-1", None, "k-2", None]


async def test_a_retry_with_the_same_idempotency_key_is_answered_as_its_original(
    proxy_process: ServiceProcess,
) -> None:
    url = "/v1/conversations/retry-key/entries"
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        original = await client.post(
            url, json={"entries": [{"role": "user", "content": "x"}]}, headers={"Idempotency-Key": "turn-1"}
        )
        await client.post(
            url, json={"entries": [{"role": "user", "content": "y"}]}, headers={"Idempotency-Key": "turn-2"}
        )
        # Ids minted by the server differ on every attempt: only the key tells the retry apart.
        retried = await client.post(
            url, json={"entries": [{"role": "user", "content": "x"}]}, headers={"Idempotency-Key": "turn-1"}
        )
        history = (await client.get(url)).json()
    assert original.json()["version"] == 1
    assert retried.json() == {
        "version": 1,
        "stored": 0,
        "duplicate": True,
        "scope": "session",
        "length": 2,
        "duplicateIds": retried.json()["duplicateIds"],
    }
    assert [e["content"] for e in history["entries"]] == ["x", "y"]


async def test_only_an_entrys_own_key_stamp_makes_a_retry(proxy_process: ServiceProcess) -> None:
    """The append finds a retry's original by its key stamp, searched as plain bytes first: the same bytes in
    an entry's item, or a longer key that starts with the same characters, are not the original."""
    url = "/v1/conversations/stamp-lookalike/entries"
    lookalike = {"role": "tool", "content": "", "item": {"x": 1, "idempotencyKey": "turn-9"}}
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        await client.post(url, json={"entries": [lookalike]})
        await client.post(
            url, json={"entries": [{"role": "user", "content": "a"}]}, headers={"Idempotency-Key": "k-10"}
        )
        stored = [
            (await client.post(url, json={"entries": [{"role": "user", "content": c}]}, headers={"Idempotency-Key": k}))
            for c, k in (("b", "turn-9"), ("c", "k-1"), ("d", "k-10"))
        ]
        history = (await client.get(url)).json()
    assert [r.json()["stored"] for r in stored] == [1, 1, 0]
    assert [e["content"] for e in history["entries"]] == ["", "a", "b", "c"]


@pytest.mark.parametrize("key", ["", "has space", "x" * 129, "semi;colon"])
async def test_a_bad_idempotency_key_is_a_typed_400(proxy_process: ServiceProcess, key: str) -> None:
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        response = await client.post(
            "/v1/conversations/bad-key/entries",
            json={"entries": [{"role": "user", "content": "x"}]},
            headers={"Idempotency-Key": key},
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request"
    assert "idempotency-key" in response.json()["error"]["message"]


@pytest.mark.parametrize("role", ["", "1user", "has space", "x" * 65, "a/b"])
async def test_a_role_outside_the_rule_is_a_typed_400(proxy_process: ServiceProcess, role: str) -> None:
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        response = await client.post(
            "/v1/conversations/bad-role/entries", json={"entries": [{"role": role, "content": "x"}]}
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request"


async def test_redaction_walks_every_string_inside_an_item(
    proxy_process: ServiceProcess, valkey_server: ValkeyProcess
) -> None:
    item = {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": [{"type": "input_text", "text": "mail bob@example.com"}, {"deep": {"phone": "+1 415 555 0100"}}],
        "keep": 4111,
    }
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        response = await client.post(
            "/v1/conversations/red/entries?redact=email,phone",
            json={"entries": [{"role": "function_call_output", "content": "bob@example.com", "item": item}]},
        )
        assert response.status_code == 200, response.text
        (entry,) = (await client.get("/v1/conversations/red/entries")).json()["entries"]
    raw = valkey_server.client().lindex(session_key(OWNER, "red"), 0)
    assert raw is not None
    assert b"bob@example.com" not in raw and b"555" not in raw
    assert entry["content"] == "[redacted:email]"
    assert entry["item"] == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": [{"type": "input_text", "text": "mail [redacted:email]"}, {"deep": {"phone": "[redacted:phone]"}}],
        "keep": 4111,
    }
    assert list(entry["item"]) == list(item)


async def test_an_item_past_its_limit_is_a_typed_413_and_nothing_is_stored(
    proxy_process: ServiceProcess, valkey_server: ValkeyProcess
) -> None:
    big = {"type": "message", "blob": "x" * env.MAX_ITEM_BYTES}
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        response = await client.post(
            "/v1/conversations/big/entries",
            json={"entries": [{"role": "user", "content": "ok"}, {"role": "user", "content": "", "item": big}]},
        )
    assert response.status_code == 413, response.text
    assert response.json()["error"]["type"] == "payload_too_large"
    assert valkey_server.client().exists(session_key(OWNER, "big")) == 0


async def test_an_item_that_is_not_an_object_is_a_typed_400(proxy_process: ServiceProcess) -> None:
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        response = await client.post(
            "/v1/conversations/list-item/entries", json={"entries": [{"role": "user", "content": "", "item": [1]}]}
        )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request"


async def test_items_count_against_the_storage_quota(
    proxy_process: ServiceProcess, valkey_server: ValkeyProcess
) -> None:
    """The bytes the accounting counts are the stored entries', items included."""
    item = {"blob": "y" * 10_000}
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=AUTH) as client:
        response = await client.post(
            "/v1/conversations/q-item/entries", json={"entries": [{"role": "user", "content": "", "item": item}]}
        )
        assert response.status_code == 200
    sync: Any = valkey_server.client()  # its hget is untyped in tests.support
    stored = len(sync.lindex(session_key(OWNER, "q-item"), 0))
    assert stored > 10_000
    assert int(sync.hget(usage_keys(OWNER.author)[1], "total")) == stored
