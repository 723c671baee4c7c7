"""The retry index against a real valkey-server: an append with an idempotency key finds out whether it is a
retry from the conversation's index of recent keys, reading no entry when its key is not there, and the
index never makes a retry look new (every write that moves the retry window back drops it, and a
conversation without one is searched as before and then indexed)."""

from __future__ import annotations

from typing import Any

from sessionmem_core.keys import retry_index_of
from sessionmem_proxy.store import (
    RETRY_WINDOW_ENTRIES,
    AppendResult,
    ConversationStore,
    NewEntry,
    retry_index_member,
)
from tests.support.stores import UNLIMITED_QUOTA
from tests.support.valkey import ValkeyProcess

AUTHOR = "team-a/agent"
KEY = "mem:team-a/agent:retries"
INDEX = retry_index_of(KEY)


async def _append(
    store: ConversationStore, idempotency_key: str | None, content: str = "x", key: str = KEY
) -> AppendResult:
    entries = [NewEntry("user", content), NewEntry("assistant", content)]
    return await store.append(key, entries, AUTHOR, 500, 600, UNLIMITED_QUOTA, idempotency_key=idempotency_key)


def _index(server: ValkeyProcess, key: str = INDEX) -> dict[str, int]:
    sync: Any = server.client()
    members = sync.zrange(key, 0, -1, withscores=True)
    return {member.decode(): int(score) for member, score in members}


def _indexed(versions: dict[str, int]) -> dict[str, int]:
    """The index the script keeps for these keys and versions: each key's digest, as the store names it."""
    return {retry_index_member(key): version for key, version in versions.items()}


def _calls(server: ValkeyProcess, command: str) -> int:
    sync: Any = server.client()
    stats = sync.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_new_key_is_told_from_the_index_without_reading_an_entry(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    versions = {f"k{n}": (await _append(store, f"k{n}")).version for n in range(10)}
    assert _index(valkey_server) == _indexed(versions)
    sync: Any = valkey_server.client()
    sync.config_resetstat()
    appended = await _append(store, "k-new")
    assert (appended.stored, appended.version) == (2, 11)
    assert _calls(valkey_server, "lrange") == 0, "the append read entries although its key is not indexed"
    assert _index(valkey_server) == _indexed({**versions, "k-new": 11})
    assert abs(sync.pttl(INDEX) - sync.pttl(KEY)) < 2000


async def test_an_indexed_key_is_still_a_retry_and_stores_nothing(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    for n in range(6):
        await _append(store, f"k{n}", f"turn {n}")
    retried = await _append(store, "k2", "turn 2 again")
    assert (retried.version, retried.stored) == (3, 0)
    assert valkey_server.client().llen(KEY) == 12


async def test_the_index_holds_the_window_and_a_key_past_it_is_new_as_before(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    """The retry window is entries: 2 per append here, so the first keys fall out of the entries' window before
    they fall out of the index; either way an append whose original left the window is stored again."""
    appends = RETRY_WINDOW_ENTRIES + 3
    for n in range(appends):
        await _append(store, f"k{n}")
    index = _index(valkey_server)
    assert len(index) == RETRY_WINDOW_ENTRIES
    assert index == _indexed({f"k{n}": n + 1 for n in range(3, appends)})
    inside = await _append(store, f"k{appends - RETRY_WINDOW_ENTRIES // 2}")
    assert inside.stored == 0
    outside = await _append(store, f"k{appends - RETRY_WINDOW_ENTRIES // 2 - 1}")
    assert outside.stored == 2, "an original older than the window's entries is not recognised (as before)"


async def test_a_conversation_without_an_index_is_searched_then_indexed(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    """As a conversation written before the index was kept: its keys are found in its entries, and the
    first new key's append indexes the window's keys (an item that merely holds such text is no key)."""
    sync: Any = valkey_server.client()
    for n in range(5):
        await _append(store, f"k{n}")
    lookalike = NewEntry("tool", "", item={"idempotencyKey": "in-an-item"})
    await store.append(KEY, [lookalike], AUTHOR, 500, 600, UNLIMITED_QUOTA)
    sync.delete(INDEX)
    retried = await _append(store, "k1")
    assert (retried.stored, retried.version) == (0, 2)
    assert not sync.exists(INDEX), "a retry writes nothing, the index included"
    await _append(store, "k5")
    assert _index(valkey_server) == _indexed({"k0": 1, "k1": 2, "k2": 3, "k3": 4, "k4": 5, "k5": 7})
    assert (await _append(store, "in-an-item")).stored == 2


async def test_writes_that_take_entries_from_the_newest_end_drop_the_index(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    """A pop or a rewind brings older entries back into the window, whose keys the index may have let go;
    a replace or a delete starts over. After each, a retry is judged from the entries again."""
    sync: Any = valkey_server.client()
    for n in range(4):
        await _append(store, f"k{n}")
    await store.pop(KEY)
    assert not sync.exists(INDEX)
    assert (await _append(store, "k1")).stored == 0, "k1's entries are still there"
    assert (await _append(store, "k4")).stored == 2
    assert sync.exists(INDEX)
    await store.rewind(KEY, 2)
    assert not sync.exists(INDEX)
    assert (await _append(store, "k2")).stored == 2, "rewound past k2: its entries are gone"
    await store.replace(KEY, [NewEntry("user", "fresh")], AUTHOR, None, 500, 600, UNLIMITED_QUOTA)
    assert not sync.exists(INDEX)
    await _append(store, "k9")
    fork = "mem:team-a/agent:fork"
    await store.create(fork, sync.lrange(KEY, 0, -1), 500, 600, UNLIMITED_QUOTA)
    assert not sync.exists(retry_index_of(fork))
    assert (await _append(store, "k9", key=fork)).stored == 0, "the fork's copy of k9's entries is its original"
    await store.delete(KEY)
    assert not sync.exists(KEY, INDEX)


async def test_the_index_holds_no_more_keys_than_the_cap_keeps_entries(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    """A conversation capped below the window: its index keeps as many keys as it keeps entries at most, and
    each is a digest of fixed size, so a long key costs the index no more than a short one."""
    entries = [NewEntry("user", "x")]
    for n in range(12):
        await store.append(KEY, entries, AUTHOR, 5, 600, UNLIMITED_QUOTA, idempotency_key=f"{n}-" + "k" * 120)
    index = _index(valkey_server)
    assert index == _indexed({f"{n}-" + "k" * 120: n + 1 for n in range(7, 12)})
    assert {len(member) for member in index} == {8}


async def test_a_new_conversation_under_a_stale_index_starts_its_own(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    """An index that outlived its conversation (one expiry set by a keyed append, then a shorter one by a
    later write) is not taken for the new conversation's."""
    sync: Any = valkey_server.client()
    await _append(store, "old")
    sync.delete(KEY)
    await _append(store, "new")
    assert _index(valkey_server) == _indexed({"new": 1})
