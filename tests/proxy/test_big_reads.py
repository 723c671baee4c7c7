"""Large windows and export pages against a real valkey-server: their bounds come from the entry sizes every
write keeps beside the list, the entries are read by plain commands (never copied through a script), and
the answer is still of one moment while the conversation is written to, and still bounded by bytes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
import pytest

from sessionmem_core.errors import ConversationBusy
from sessionmem_core.keys import sizes_key_of
from sessionmem_proxy.bulk import EXPORT_FIRST_STEP_ENTRIES, EXPORT_MAX_STEP_ENTRIES
from sessionmem_proxy.resp_client import Arg, Endpoint, PipelinedValkey, Session
from sessionmem_proxy.store import (
    READ_ANSWER_BYTES,
    READ_ATTEMPTS,
    READ_COPY_BYTES,
    ConversationStore,
    NewEntry,
    UsageLedger,
    version_of,
    written_at,
)
from tests.support.stores import UNLIMITED_QUOTA
from tests.support.valkey import ValkeyProcess

AUTHOR = "team-a/agent"
KEY = "mem:team-a/agent:big"
PAGE_BYTES = 1024 * 1024


def _entry(index: int, size: int) -> NewEntry:
    return NewEntry("user", f"e{index} " + "x" * size, f"e{index}")


def _ids(raw_entries: list[bytes]) -> list[str]:
    return [orjson.loads(raw)["id"] for raw in raw_entries]


async def _fill(store: ConversationStore, sizes: list[int], key: str = KEY, cap: int = 500) -> None:
    for i, size in enumerate(sizes):
        await store.append(key, [_entry(i, size)], AUTHOR, cap=cap, ttl_seconds=600, quota=UNLIMITED_QUOTA)


def _slowlog_commands(server: ValkeyProcess) -> list[list[str]]:
    entries: Any = server.client().execute_command("SLOWLOG", "GET", "-1")
    return [[part.decode(errors="replace") if isinstance(part, bytes) else str(part) for part in e[3]] for e in entries]


def _log_every_command(server: ValkeyProcess) -> None:
    sync = server.client()
    sync.execute_command("CONFIG", "SET", "slowlog-log-slower-than", "0")
    sync.execute_command("CONFIG", "SET", "slowlog-max-len", "1024")
    sync.execute_command("SLOWLOG", "RESET")


async def test_a_big_window_is_read_by_lrange_within_the_byte_bound(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    """A window of megabytes: the script only finds its bounds, and the entries come by LRANGE (what a
    script copying them cost Valkey's one thread is what every other tenant waited for)."""
    await _fill(store, [300_000] * 30)
    _log_every_command(valkey_server)
    result = await store.read(KEY, 500)
    fitting = READ_ANSWER_BYTES // 300_100
    assert _ids(result.raw_entries) == [f"e{i}" for i in range(30 - fitting, 30)]
    assert sum(map(len, result.raw_entries)) <= READ_ANSWER_BYTES
    assert result.version == 30
    commands = _slowlog_commands(valkey_server)
    assert ["LRANGE", KEY, str(-fitting), "-1"] in commands, commands
    assert ["WATCH", KEY] in commands, commands


async def test_a_small_window_is_still_one_script_call(store: ConversationStore, valkey_server: ValkeyProcess) -> None:
    await _fill(store, [200] * 40)
    await store.read(KEY, 1)  # the script loaded
    _log_every_command(valkey_server)
    result = await store.read(KEY, 40)
    assert _ids(result.raw_entries) == [f"e{i}" for i in range(40)]
    assert sum(map(len, result.raw_entries)) <= READ_COPY_BYTES
    commands = [c[0] for c in _slowlog_commands(valkey_server)]
    assert commands.count("EVALSHA_RO") == 1 and "WATCH" not in commands, commands


async def test_the_sizes_follow_every_write(store: ConversationStore, valkey_server: ValkeyProcess) -> None:
    sync = valkey_server.client()

    def aligned(key: str = KEY) -> None:
        entries = sync.lrange(key, 0, -1)
        assert [int(s) for s in sync.lrange(sizes_key_of(key), 0, -1)] == [len(e) for e in entries]
        assert abs(sync.pttl(sizes_key_of(key)) - sync.pttl(key)) < 2000 if entries else True

    await _fill(store, [10 * (i + 1) for i in range(8)], cap=5)  # trimmed by the cap
    aligned()
    await store.pop(KEY)  # the new newest is stamped: its size changes
    aligned()
    await store.rewind(KEY, 5)
    aligned()
    await store.replace(KEY, [_entry(50, 70), _entry(51, 80)], AUTHOR, None, 5, 600, UNLIMITED_QUOTA)
    aligned()
    fork = "mem:team-a/agent:fork"
    await store.create(fork, sync.lrange(KEY, 0, -1), 5, 600, UNLIMITED_QUOTA)
    aligned(fork)
    source, trimmed = "mem:team-a/agent:source", "mem:team-a/agent:trimmed"
    await _fill(store, [10, 20, 30, 40], key=source)
    created = await store.create(trimmed, sync.lrange(source, 0, -1), 3, 600, UNLIMITED_QUOTA)  # past the cap
    assert (created.stored, created.version) == (3, 4)
    aligned(trimmed)
    await store.delete(KEY)
    assert not sync.exists(KEY, sizes_key_of(KEY))
    await store.pop(fork)
    await store.pop(fork)
    assert not sync.exists(fork, sizes_key_of(fork))


async def test_a_list_whose_sizes_do_not_cover_the_window_is_read_whole(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    """Entries written before the sizes were kept (or by hand): the window is found by reading them."""
    sync: Any = valkey_server.client()
    await _fill(store, [200_000] * 25)
    sync.delete(sizes_key_of(KEY))  # as a list written before the sizes were kept
    await _fill(store, [200_000] * 3)  # now its newest three have sizes
    raw = sync.lrange(KEY, 0, -1)
    expected: list[bytes] = []
    for entry in reversed(raw):
        if expected and sum(map(len, expected)) + len(entry) > READ_ANSWER_BYTES:
            break
        expected.insert(0, entry)
    assert (await store.read(KEY, 500)).raw_entries == expected
    sync.rpush(KEY, raw[0])  # by hand: the sizes are now one behind
    assert (await store.read(KEY, 500)).raw_entries == [*expected[1:], raw[0]]


def _pages_by_rule(raw: list[bytes], budget: int, first_step: int, max_step: int) -> list[list[bytes]]:
    """The export's documented paging: steps sized from the largest entry so far, until a page passes
    ``budget`` bytes."""
    pages, at = [], 0
    while at < len(raw):
        page: list[bytes] = []
        taken, step = 0, first_step
        while taken < budget and at < len(raw):
            got = raw[at : at + step]
            page += got
            taken += sum(map(len, got))
            at += len(got)
            step = max(1, min(max_step, (budget - taken) // max(map(len, got))))
        pages.append(page)
    return pages


async def test_big_export_pages_keep_their_bounds(store: ConversationStore, valkey_server: ValkeyProcess) -> None:
    sizes = [(i * 7919) % 250_000 + 100 for i in range(60)]
    await _fill(store, sizes)
    raw = valkey_server.client().lrange(KEY, 0, -1)
    _log_every_command(valkey_server)
    pages, offset = [], 0
    while True:
        page = await store.export_page(
            KEY, offset, PAGE_BYTES, EXPORT_FIRST_STEP_ENTRIES, EXPORT_MAX_STEP_ENTRIES, offset == 0
        )
        assert (page.length, page.version) == (60, 60)
        pages.append(page.raw_entries)
        if page.next_offset is None:
            break
        offset = page.next_offset
    assert pages == _pages_by_rule(raw, PAGE_BYTES, EXPORT_FIRST_STEP_ENTRIES, EXPORT_MAX_STEP_ENTRIES)
    assert ["WATCH", KEY] in _slowlog_commands(valkey_server), "a page of megabytes was copied in a script"


async def test_big_reads_during_writes_are_each_of_one_moment(
    store: ConversationStore, valkey_server: ValkeyProcess
) -> None:
    """Appends (trimmed by the cap), pops, rewinds and compactions race big reads of the same conversation:
    every window is the newest entries of the list as it was at the version it answers, within the bound,
    and a summary covers none of the entries answered with it."""
    sync = valkey_server.client()
    await _fill(store, [150_000] * 30, cap=40)
    states: dict[int, list[bytes]] = {30: sync.lrange(KEY, 0, -1)}
    stop = asyncio.Event()

    async def write() -> None:
        i = 100
        while not stop.is_set():
            i += 1
            if i % 7 == 0:
                version = (await store.pop(KEY)).version
            elif i % 11 == 0:
                version = (await store.rewind(KEY, version - 3)).version
            elif i % 5 == 0:
                await store.compact(KEY, NewEntry("system", "summary"), AUTHOR, version - 2, UNLIMITED_QUOTA)
                continue
            else:
                size = 150_000 if i % 3 else 2_000
                version = (await store.append(KEY, [_entry(i, size)], AUTHOR, 40, 600, UNLIMITED_QUOTA)).version
            states[version] = sync.lrange(KEY, 0, -1)
            await asyncio.sleep(0.002)
        stop.set()

    async def read() -> int:
        checked = 0
        while not stop.is_set():
            try:
                result = await store.read_with_summary(KEY, 500)
            except ConversationBusy:  # overtaken by writes every time: refused whole, never answered mixed
                continue
            window = result.raw_entries
            assert not window or result.version == version_of(window[-1])
            assert result.version in states or result.version > max(states), "a version no write made"
            while result.version not in states:  # its writer records it just after: wait for that
                await asyncio.sleep(0)
            state = states[result.version]
            summary = result.raw_summary
            kept = [raw for raw in state if summary is None or written_at(raw) > written_at(summary)]
            assert window == kept[len(kept) - len(window) :], "not the newest entries of one moment"
            newest = state[len(state) - len(window) :] if summary is None else window
            assert sum(map(len, newest)) <= READ_ANSWER_BYTES or len(newest) == 1
            if summary is None and len(window) < len(state):
                assert sum(map(len, state[-len(window) - 1 :])) > READ_ANSWER_BYTES, "the window stopped early"
            checked += 1
        return checked

    writer = asyncio.ensure_future(write())
    readers = [asyncio.ensure_future(read()) for _ in range(3)]
    await asyncio.sleep(4.0)
    stop.set()
    await writer
    assert sum(await asyncio.gather(*readers)) > 30


class _Overtaking(Session):
    """A held connection after whose every WATCH the watched key is written from another connection, as a
    busy writer would, ``times`` times."""

    def __init__(self, held: Session, client: PipelinedValkey, times: list[int]) -> None:
        self._held, self._client, self._times = held, client, times

    async def run(self, *commands: Sequence[Arg]) -> list[Any]:
        replies = await self._held.run(*commands)
        if commands[0][0] == "WATCH" and self._times[0] > 0:
            self._times[0] -= 1
            await self._client.execute(("PEXPIRE", commands[0][1], 600_000))  # a write: the WATCH fires
        return replies


class _OvertakenClient(PipelinedValkey):
    def __init__(self, url: str, times: int) -> None:
        super().__init__(Endpoint.from_url(url), 5.0)
        self.times = [times]

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[Session]:
        async with super().exclusive() as held:
            yield _Overtaking(held, self, self.times)


@pytest.mark.parametrize("overtaken", [READ_ATTEMPTS - 1, READ_ATTEMPTS])
async def test_a_big_read_overtaken_by_writes_is_planned_again_then_refused_whole(
    store: ConversationStore, valkey_server: ValkeyProcess, overtaken: int
) -> None:
    await _fill(store, [300_000] * 20)
    client = _OvertakenClient(valkey_server.url, overtaken)
    try:
        overtaken_store = ConversationStore(client, UsageLedger(client))
        if overtaken < READ_ATTEMPTS:
            assert (await overtaken_store.read(KEY, 500)).raw_entries == (await store.read(KEY, 500)).raw_entries
        else:
            with pytest.raises(ConversationBusy):
                await overtaken_store.read(KEY, 500)
            client.times[0] = READ_ATTEMPTS
            with pytest.raises(ConversationBusy):
                await overtaken_store.export_page(KEY, 0, PAGE_BYTES, 4, 256, False)
        assert client.times == [0], "every attempt was overtaken once"
    finally:
        await client.aclose()
