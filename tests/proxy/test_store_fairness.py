"""The store against a real valkey-server: per-entry retry dedup in a bounded tail window, a full Valkey as
a typed 503, and one slow command failing only its own request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import valkey

from sessionmem_core.errors import BackendUnavailable
from sessionmem_proxy.store import RETRY_WINDOW_BYTES, RETRY_WINDOW_ENTRIES, ConversationStore, NewEntry
from sessionmem_proxy.valkey_client import connect
from tests.support.valkey import ValkeyProcess

AUTHOR = "team-a/agent"
KEY = "mem:team-a/agent:c1"


@pytest.fixture
async def store(valkey_server: ValkeyProcess) -> AsyncIterator[ConversationStore]:
    client = connect(valkey_server.url, 2.0)
    yield ConversationStore(client)
    await client.aclose()


def stored_ids(server: ValkeyProcess, key: str = KEY) -> list[str]:
    return [orjson.loads(raw)["id"] for raw in server.client().lrange(key, 0, -1)]


def user(message_id: str | None, content: str = "hi") -> NewEntry:
    return NewEntry("user", content, message_id)


async def test_a_mixed_batch_stores_the_new_entries_and_names_the_duplicates(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    first = await store.append(KEY, [user("m1"), user("m2")], AUTHOR, cap=100, ttl_seconds=60)
    assert (first.stored, first.duplicate_ids, first.duplicate) == (2, (), False)

    mixed = await store.append(KEY, [user("m2"), user("m3")], AUTHOR, cap=100, ttl_seconds=60)
    assert (mixed.stored, mixed.duplicate_ids, mixed.duplicate) == (1, ("m2",), False)
    assert mixed.version == first.version + 1
    assert stored_ids(valkey_server) == ["m1", "m2", "m3"]


async def test_an_id_repeated_in_one_batch_is_stored_once(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    result = await store.append(KEY, [user("a"), user("b"), user("a")], AUTHOR, cap=100, ttl_seconds=60)
    assert (result.stored, result.duplicate_ids, result.length) == (2, ("a",), 2)
    assert stored_ids(valkey_server) == ["a", "b"]


async def test_a_whole_retry_stores_nothing_and_keeps_the_version(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    first = await store.append(KEY, [user("u1"), NewEntry("assistant", "a", "a1")], AUTHOR, cap=100, ttl_seconds=60)
    again = await store.append(KEY, [user("u1"), NewEntry("assistant", "a", "a1")], AUTHOR, cap=100, ttl_seconds=60)
    assert again.duplicate and again.stored == 0
    assert (again.version, again.length, again.duplicate_ids) == (first.version, 2, ("u1", "a1"))
    assert stored_ids(valkey_server) == ["u1", "a1"]


async def test_entries_without_a_client_id_are_never_duplicates(store: ConversationStore) -> None:
    for _ in range(3):
        result = await store.append(KEY, [user(None), user(None)], AUTHOR, cap=100, ttl_seconds=60)
        assert (result.stored, result.duplicate_ids) == (2, ())
    assert result.length == 6


async def test_retries_are_recognised_within_the_window_and_only_there(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    """The check reads a bounded tail of the conversation, however long it is: the original is found while
    fewer than RETRY_WINDOW_ENTRIES entries are newer than it, and is no longer looked for past that (which
    is what keeps an append's cost independent of the conversation's length)."""
    cap = 4 * RETRY_WINDOW_ENTRIES
    await store.append(KEY, [user("old")], AUTHOR, cap=cap, ttl_seconds=60)
    filler = [user(None) for _ in range(RETRY_WINDOW_ENTRIES - 1)]
    for start in range(0, len(filler), 32):
        await store.append(KEY, filler[start : start + 32], AUTHOR, cap=cap, ttl_seconds=60)
    inside = await store.append(KEY, [user("old"), user("new")], AUTHOR, cap=cap, ttl_seconds=60)
    assert (inside.stored, inside.duplicate_ids) == (1, ("old",))  # "old" is the window's oldest entry

    await store.append(KEY, [user(None)], AUTHOR, cap=cap, ttl_seconds=60)
    past = await store.append(KEY, [user("old")], AUTHOR, cap=cap, ttl_seconds=60)
    assert past.stored == 1  # now RETRY_WINDOW_ENTRIES + 1 entries back: outside the documented window
    assert stored_ids(valkey_server).count("old") == 2


async def test_the_window_also_stops_at_its_byte_budget(store: ConversationStore) -> None:
    """Behind a few very large entries the check stops reading once RETRY_WINDOW_BYTES are read: what an
    append copies stays bounded however large the tenant's entries are."""
    big = "x" * (RETRY_WINDOW_BYTES // 3)
    await store.append(KEY, [user("small-behind")], AUTHOR, cap=100, ttl_seconds=60)
    await store.append(KEY, [user(None, "y" * 600) for _ in range(4)], AUTHOR, cap=100, ttl_seconds=60)
    assert (await store.append(KEY, [user("small-behind")], AUTHOR, cap=100, ttl_seconds=60)).duplicate

    other = "mem:team-a/agent:c2"
    await store.append(other, [user("big-behind")], AUTHOR, cap=100, ttl_seconds=60)
    for _ in range(4):
        await store.append(other, [user(None, big)], AUTHOR, cap=100, ttl_seconds=60)
    assert (await store.append(other, [user("big-behind")], AUTHOR, cap=100, ttl_seconds=60)).stored == 1


async def test_the_cap_still_trims_and_the_version_still_moves(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    versions = [(await store.append(KEY, [user(f"m{i}")], AUTHOR, cap=3, ttl_seconds=60)).version for i in range(6)]
    assert versions == [1, 2, 3, 4, 5, 6]
    assert stored_ids(valkey_server) == ["m3", "m4", "m5"]
    retry = await store.append(KEY, [user("m5")], AUTHOR, cap=3, ttl_seconds=60)
    assert retry.duplicate and retry.version == 6


async def test_bytes_added_account_for_what_the_cap_trims(store: ConversationStore) -> None:
    first = await store.append(KEY, [user("a", "x" * 100)], AUTHOR, cap=1, ttl_seconds=60)
    assert first.created and first.bytes_added > 100
    same_size = await store.append(KEY, [user("b", "y" * 100)], AUTHOR, cap=1, ttl_seconds=60)
    assert not same_size.created and same_size.bytes_added == 0  # one in, one of the same size out
    smaller = await store.append(KEY, [user("c", "z" * 40)], AUTHOR, cap=1, ttl_seconds=60)
    assert smaller.bytes_added == -60


async def test_a_full_valkey_is_backend_unavailable_not_an_internal_error() -> None:
    server = ValkeyProcess(extra_args=("--maxmemory", "4mb", "--maxmemory-policy", "noeviction"))
    server.start()
    client = connect(server.url, 2.0)
    try:
        store = ConversationStore(client)
        big = "x" * 200_000
        with pytest.raises(BackendUnavailable) as raised:
            for i in range(100):
                await store.append(f"mem:team-a/agent:c{i}", [user(f"m{i}", big)], AUTHOR, cap=10, ttl_seconds=60)
        assert raised.value.status == 503
        assert "maxmemory" in raised.value.message
        # Reads still work on a full server: only writes are refused.
        assert (await store.read("mem:team-a/agent:c0", 1)).raw_entries
    finally:
        await client.aclose()
        server.close()


async def test_a_paused_write_times_out_alone_while_concurrent_reads_succeed(valkey_server: ValkeyProcess) -> None:
    """A command the server holds (here every write, by CLIENT PAUSE WRITE from another connection) fails
    only its own request: reads issued at the same time, on the same client, are answered meanwhile."""
    client = connect(valkey_server.url, 0.5, max_connections=8)
    store = ConversationStore(client)
    admin: Any = valkey.Valkey(host="127.0.0.1", port=valkey_server.port)  # untyped execute_command
    try:
        await store.append(KEY, [user("m1")], AUTHOR, cap=10, ttl_seconds=60)
        admin.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
        write = asyncio.ensure_future(store.append(KEY, [user("m2")], AUTHOR, cap=10, ttl_seconds=60))
        await asyncio.sleep(0)  # the write is on the wire first
        reads = [asyncio.ensure_future(store.read(KEY, 10)) for _ in range(20)]
        results = await asyncio.gather(*reads)
        assert all([orjson.loads(raw)["id"] for raw in r.raw_entries] == ["m1"] for r in results)
        with pytest.raises(BackendUnavailable):
            await write
        # And the client goes on serving reads after the timeout.
        assert len((await store.read(KEY, 10)).raw_entries) == 1
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        await client.aclose()
