"""Encryption at rest, the crypto on its own: sealing and opening entries, keys bound to their unit and
conversation, KEK rotation and re-wrapping, erasure by destroying a data key (the directory store)."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path

import orjson
import pytest

from sessionmem_core import env
from sessionmem_core.errors import DataKeyUnavailable, SealedEntryInvalid
from sessionmem_core.keys import data_key_unit as unit_of
from sessionmem_core.keys import data_key_unit_of_space as unit_of_prefix
from sessionmem_proxy import datakeys, sealing
from sessionmem_proxy.datakeys import DirectoryDataKeyStore, Keyring, new_kek, rewrap
from sessionmem_proxy.sealing import Sealer

KEY = "mem:team/support:c1"
OTHER = "mem:team/support:c2"
USER_KEY = "mem:team/support:u:" + "a" * 32 + ":c1"
SENTENCE = "My passport number is X1234567"


def _keyring(folder: Path, *kids: str) -> Keyring:
    folder.mkdir(exist_ok=True)
    for kid in kids:
        (folder / kid).write_bytes(new_kek() + b"\n")
    return Keyring.load(folder)


def _entry(entry_id: str, version: int, rest: bytes) -> bytes:
    return b'{"id":"' + entry_id.encode() + b'","v":' + str(version).encode() + rest


def _body(content: str) -> bytes:
    return orjson.dumps({"role": "user", "content": content, "author": "team/support", "ts": 1})


async def _sealed(sealer: Sealer, key: str, entry_id: str, content: str, version: int = 1) -> bytes:
    dek = await sealer.writing_key(key)
    return _entry(entry_id, version, Sealer.seal(dek, key, entry_id, _body(content)))


_RAW_MARK = b',"sealed":\x02'


def _flipped(raw: bytes, at: int = -1) -> bytes:
    """A sealed entry (raw form) with one bit of its sealed part flipped."""
    head, _, blob = raw.partition(_RAW_MARK)
    altered = bytearray(b"\x02" + blob)
    altered[at] ^= 0x01
    return head + b',"sealed":' + bytes(altered)


async def _sealed_in_base64(sealer: Sealer, key: str, entry_id: str, content: str, version: int = 1) -> bytes:
    """An entry as proxies sealed them before the raw form: the sealed part in base64, in a JSON string,
    its format byte 0x01 (built here by hand: nothing seals in that form any more)."""
    dek = await sealer.writing_key(key)
    header, nonce = b"\x01" + bytes.fromhex(dek.dek_id), os.urandom(12)
    sealed = dek.aead.encrypt(nonce, _body(content), sealing.sealed_context(key, entry_id, header))
    return _entry(entry_id, version, b',"sealed":"' + base64.b64encode(header + nonce + sealed) + b'"}')


def test_units_follow_the_key_layouts() -> None:
    assert unit_of(KEY) == "team/support"
    assert unit_of(USER_KEY) == "team/support:u:" + "a" * 32
    assert unit_of("mem:shared:ops:c9") == "shared:ops"
    assert unit_of_prefix("mem:team/support:") == "team/support"
    assert unit_of_prefix("mem:shared:ops:") == "shared:ops"


def test_a_sealed_entry_hides_its_text_and_opens_to_the_stored_form(tmp_path: Path) -> None:
    async def scenario() -> None:
        sealer = Sealer(_keyring(tmp_path / "kek", "2026-12"), DirectoryDataKeyStore(tmp_path / "deks"))
        raw = await _sealed(sealer, KEY, "m1", SENTENCE, version=7)
        assert SENTENCE.encode() not in raw and b"passport" not in raw
        # The sealed part in raw bytes (no base64): its format byte, the DEK id, the nonce, ciphertext and tag.
        dek = await sealer.writing_key(KEY)
        assert raw.startswith(b'{"id":"m1","v":7,"sealed":\x02' + bytes.fromhex(dek.dek_id))
        assert len(raw) == len(b'{"id":"m1","v":7,"sealed":') + 1 + 8 + 12 + len(_body(SENTENCE)) + 16
        opened = await sealer.open(KEY, [raw])
        assert opened == [_entry("m1", 7, b"," + _body(SENTENCE)[1:])]
        assert orjson.loads(opened[0])["content"] == SENTENCE
        # Two seals of the same text differ (a fresh nonce each).
        assert await _sealed(sealer, KEY, "m1", SENTENCE, version=7) != raw
        # An entry stored before sealing was turned on reads as it is.
        legacy = _entry("m0", 1, b"," + _body("plain")[1:])
        assert await sealer.open(KEY, [legacy]) == [legacy]

    asyncio.run(scenario())


def test_moved_or_altered_ciphertext_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        sealer = Sealer(_keyring(tmp_path / "kek", "k1"), DirectoryDataKeyStore(tmp_path / "deks"))
        raw = await _sealed(sealer, KEY, "m1", SENTENCE)
        assert len(await sealer.open(KEY, [raw])) == 1  # opened once here: what follows is not a memo
        await sealer.writing_key(OTHER)  # same unit, another conversation
        with pytest.raises(SealedEntryInvalid):
            await sealer.open(OTHER, [raw])  # copied to another conversation of the same agent
        with pytest.raises(SealedEntryInvalid):
            await sealer.open(KEY, [raw.replace(b'"id":"m1"', b'"id":"m2"')])  # another id
        for at in (-1, 0, 9, 21):  # the tag, the format byte, the nonce, the ciphertext
            with pytest.raises(SealedEntryInvalid):
                await sealer.open(KEY, [_flipped(raw, at)])
        with pytest.raises(SealedEntryInvalid):  # cut short: no room for a nonce
            await sealer.open(KEY, [raw[: raw.index(_RAW_MARK) + len(_RAW_MARK) + 12]])
        # A sealed part behind a head that names no id is refused, not answered as a plain entry.
        with pytest.raises(SealedEntryInvalid):
            await sealer.open(KEY, [raw.replace(b'{"id":"m1",', b'{"di":"m1",')])

    asyncio.run(scenario())


def test_entries_sealed_in_base64_before_still_open(tmp_path: Path) -> None:
    """No migration: a conversation may hold entries sealed in the base64 form, in the raw form and unsealed,
    side by side, and each opens (or is refused, or is left out once its key is erased) as before."""

    async def scenario() -> None:
        sealer = Sealer(_keyring(tmp_path / "kek", "k1"), DirectoryDataKeyStore(tmp_path / "deks"))
        cold = Sealer(sealer.wrapper, sealer.keys, opened_bytes=0)
        older = await _sealed_in_base64(sealer, KEY, "m1", "sealed before", version=1)
        legacy = _entry("m2", 2, b"," + _body("stored unsealed")[1:])
        # An unsealed entry whose item has a "sealed" key is still an unsealed entry.
        with_item = _entry("m3", 3, b"," + _body("with an item")[1:-1] + b',"item":{"a":1,"sealed":"QUJD"}}')
        with_number = _entry("m4", 4, b"," + _body("with an item")[1:-1] + b',"item":{"a":1,"sealed":7}}')
        newer = await _sealed(sealer, KEY, "m5", "sealed now", version=5)
        window = [older, legacy, with_item, with_number, newer]
        expected = [
            _entry("m1", 1, b"," + _body("sealed before")[1:]),
            legacy,
            with_item,
            with_number,
            _entry("m5", 5, b"," + _body("sealed now")[1:]),
        ]
        assert await cold.open(KEY, window) == expected
        assert await sealer.open(KEY, window) == expected
        assert await sealer.open(KEY, [bytes(bytearray(raw)) for raw in window]) == expected  # remembered
        blob = older.split(b'"sealed":"')[1][:-2]
        altered = bytearray(base64.b64decode(blob))
        altered[-1] ^= 0x01
        with pytest.raises(SealedEntryInvalid):
            await cold.open(KEY, [older.replace(blob, base64.b64encode(bytes(altered)))])
        with pytest.raises(SealedEntryInvalid):
            await cold.open(OTHER, [older])  # bound to its conversation as before
        await sealer.erase(unit_of(KEY))
        assert await sealer.open(KEY, window) == [legacy, with_item, with_number]

    asyncio.run(scenario())


def test_a_reread_answers_what_opening_does_and_never_outlives_the_key(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = DirectoryDataKeyStore(tmp_path / "deks")
        keyring = _keyring(tmp_path / "kek", "k1")
        now = [0.0]
        sealer = Sealer(keyring, store, cache_seconds=30.0, clock=lambda: now[0])
        replica = Sealer(keyring, store, cache_seconds=30.0, clock=lambda: now[0])
        window = [await _sealed(sealer, KEY, f"m{i}", f"{SENTENCE} ({i})", version=i) for i in range(1, 6)]
        first = await sealer.open(KEY, window)
        assert first == await Sealer(keyring, store, opened_bytes=0).open(KEY, window)
        # Read again, and again with the window moved on (and a stamp on one entry): the same answers.
        assert await sealer.open(KEY, window) == first
        later = [*window[2:], await _sealed(sealer, KEY, "m6", "newer", version=6)]
        later[0] = later[0].replace(b',"v":3', b',"v":3,"rewoundAt":9')
        assert await sealer.open(KEY, later) == await Sealer(keyring, store, opened_bytes=0).open(KEY, later)
        assert orjson.loads((await sealer.open(KEY, later))[0])["rewoundAt"] == 9
        # A re-read entry is still bound to its conversation: copied to another, it does not open.
        with pytest.raises(SealedEntryInvalid):
            await sealer.open(OTHER, window)
        assert len(await replica.open(KEY, window)) == 5
        # Erased here: gone from this replica's answers at once, from the other's within its cache time.
        await sealer.erase(unit_of(KEY))
        assert await sealer.open(KEY, window) == []
        now[0] = 29.0
        assert len(await replica.open(KEY, window)) == 5
        now[0] = 31.0
        assert await replica.open(KEY, window) == []

    asyncio.run(scenario())


def test_a_replica_opens_an_entry_sealed_with_a_key_newer_than_it_cached_a_moment_ago(tmp_path: Path) -> None:
    """The store is asked again at once when a read meets a DEK id other than the cached one (a fork copies
    what its read answered: an entry left out there would be lost from the copy), and then at most once
    per second."""

    async def scenario() -> None:
        store = DirectoryDataKeyStore(tmp_path / "deks")
        keyring = _keyring(tmp_path / "kek", "k1")
        now = [100.0]
        replica = Sealer(keyring, store, clock=lambda: now[0])
        other = Sealer(keyring, store)
        await _sealed(replica, KEY, "m1", "before")  # the replica caches the unit's key
        await other.erase(unit_of(KEY))
        new = await _sealed(other, KEY, "m2", "after")  # under the unit's new key
        now[0] += 0.1
        assert [orjson.loads(raw)["content"] for raw in await replica.open(KEY, [new])] == ["after"]
        # Within the second after that, an entry of a key the store no longer holds does not ask again.
        await other.erase(unit_of(KEY))
        newest = await _sealed(other, KEY, "m3", "newest")
        now[0] += 0.5
        assert await replica.open(KEY, [newest]) == []
        now[0] += 0.6
        assert [orjson.loads(raw)["content"] for raw in await replica.open(KEY, [newest])] == ["newest"]

    asyncio.run(scenario())


def _check_memos(sealer: Sealer) -> None:
    """What a sealer remembers is counted right, and each memo's window pairs stored and answered entries."""
    memos = list(sealer._opened.values())
    assert sealer._opened_bytes == sum(memo.size for memo in memos)
    for memo in memos:
        assert len(memo.window) == len(memo.answer)
        assert memo.window_size == sum(map(len, memo.window))
        assert all(
            memo.entries.get(raw, answer) == answer for raw, answer in zip(memo.window, memo.answer, strict=True)
        )


def test_a_window_read_again_or_moved_on_answers_what_opening_does(tmp_path: Path) -> None:
    """The memo's last window answers the next read by comparing bytes: the same window, one moved on by
    a turn, one with a stamp on its newest entry, and never an entry altered by one byte."""

    async def scenario() -> None:
        store = DirectoryDataKeyStore(tmp_path / "deks")
        keyring = _keyring(tmp_path / "kek", "k1")
        sealer = Sealer(keyring, store)
        cold = Sealer(keyring, store, opened_bytes=0)
        stored = [await _sealed(sealer, KEY, f"m{i}", f"{SENTENCE} ({i})", version=i) for i in range(1, 13)]

        async def same(window: list[bytes]) -> None:
            # Fresh bytes objects each time, as Valkey's answers are.
            assert await sealer.open(KEY, [bytes(bytearray(raw)) for raw in window]) == await cold.open(KEY, window)
            _check_memos(sealer)

        for window in (stored[0:8], stored[0:8], stored[2:10], stored[4:12], stored[4:12], stored[5:12]):
            await same(window)
        stamped = [*stored[4:11], stored[11].replace(b',"v":12', b',"v":12,"rewoundAt":13')]
        await same(stamped)
        await same(stored[6:12])
        await same([stored[3]])  # a pop's or a summary's one entry leaves the window as it was
        await same(stored[6:12])
        tampered = [*stored[6:8], _flipped(stored[8]), *stored[9:12]]
        with pytest.raises(SealedEntryInvalid):
            await sealer.open(KEY, tampered)

    asyncio.run(scenario())


def test_what_a_replica_keeps_of_opened_entries_is_bounded(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = DirectoryDataKeyStore(tmp_path / "deks")
        keyring = _keyring(tmp_path / "kek", "k1")
        bound = 4096
        sealer = Sealer(keyring, store, opened_bytes=bound)
        for c in range(20):
            key = f"{KEY}-{c}"
            window = [await _sealed(sealer, key, f"m{i}", SENTENCE, version=i) for i in range(1, 9)]
            assert len(await sealer.open(key, window)) == 8
            assert 0 < sealer._opened_bytes <= bound
        assert len(sealer._opened) < 20  # the least recently read were dropped
        # A conversation's memo starts over when the window moved far past what it holds.
        key, entries = f"{KEY}-x", []
        roomy = Sealer(keyring, store)
        for i in range(1, 200):
            entries.append(await _sealed(roomy, key, f"m{i}", SENTENCE, version=i))
            assert len(await roomy.open(key, entries[-2:])) == min(i, 2)
            _check_memos(roomy)
        assert len(roomy._opened[key].entries) <= 4 * 2 + 64
        # Nor does a conversation's memo outlive its reads by more than the cache time.
        now = [0.0]
        timed = Sealer(keyring, store, cache_seconds=30.0, clock=lambda: now[0])
        assert len(await timed.open(key, entries[-4:])) == 4
        now[0] = 20.0
        assert len(await timed.open(f"{KEY}-0", [await _sealed(timed, f"{KEY}-0", "n1", SENTENCE)])) == 1
        assert set(timed._opened) == {key, f"{KEY}-0"}
        now[0] = 40.0
        assert len(await timed.open(f"{KEY}-0", [await _sealed(timed, f"{KEY}-0", "n2", SENTENCE)])) == 1
        assert set(timed._opened) == {f"{KEY}-0"}

    asyncio.run(scenario())


def test_units_have_their_own_keys(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = DirectoryDataKeyStore(tmp_path / "deks")
        sealer = Sealer(_keyring(tmp_path / "kek", "k1"), store)
        agent, user = await sealer.writing_key(KEY), await sealer.writing_key(USER_KEY)
        assert agent.header != user.header
        # Copied into a user's bucket (another unit), an agent's entry is not the bucket's: it never opens.
        raw = await _sealed(sealer, KEY, "m1", SENTENCE)
        moved_key = USER_KEY[: USER_KEY.rindex(":") + 1] + "c1"
        assert await sealer.open(moved_key, [raw]) == []
        assert sorted(r.unit for r in await store.records()) == sorted([unit_of(KEY), unit_of(USER_KEY)])

    asyncio.run(scenario())


def test_erasure_destroys_the_key_and_a_later_write_makes_a_new_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = DirectoryDataKeyStore(tmp_path / "deks")
        keyring = _keyring(tmp_path / "kek", "k1")
        sealer, replica = Sealer(keyring, store), Sealer(keyring, store)
        raw = await _sealed(sealer, USER_KEY, "m1", SENTENCE)
        agent_raw = await _sealed(sealer, KEY, "m1", "the agent's own")
        assert await replica.open(USER_KEY, [raw]) != []
        assert await sealer.erase(unit_of(USER_KEY)) == [unit_of(USER_KEY)]
        assert await sealer.open(USER_KEY, [raw]) == []  # erased: left out
        assert await sealer.open(KEY, [agent_raw]) != []  # the agent's own unit is untouched
        fresh = await _sealed(sealer, USER_KEY, "m2", "after the erasure")
        assert await sealer.open(USER_KEY, [raw, fresh]) == await sealer.open(USER_KEY, [fresh])
        # The replica cached the old key; it meets a new DEK id and asks the store again.
        replica_clock = [100.0]
        late = Sealer(keyring, store, clock=lambda: replica_clock[0])
        assert len(await late.open(USER_KEY, [fresh])) == 1
        # Erasing the agent takes its users' buckets with it.
        assert await sealer.erase(unit_of(KEY)) == sorted([unit_of(KEY), unit_of(USER_KEY)])
        assert await store.records() == []
        assert await Sealer(keyring, store).open(KEY, [agent_raw]) == []

    asyncio.run(scenario())


def test_a_replica_caches_an_erased_key_at_most_its_cache_time(tmp_path: Path) -> None:
    """(The store never writes with the cached erased key: tests/proxy/test_sealing_replicas.py.)"""

    async def scenario() -> None:
        store = DirectoryDataKeyStore(tmp_path / "deks")
        keyring = _keyring(tmp_path / "kek", "k1")
        now = [0.0]
        replica = Sealer(keyring, store, cache_seconds=30.0, clock=lambda: now[0])
        before = await replica.writing_key(KEY)
        await Sealer(keyring, store).erase(unit_of(KEY))
        now[0] = 29.0
        assert (await replica.writing_key(KEY)).header == before.header  # still cached
        now[0] = 31.0
        after = await replica.writing_key(KEY)
        assert after.header != before.header  # a new DEK after the erasure
        await Sealer(keyring, store).erase(unit_of(KEY))
        # Asked afresh (the store refused the cached one), the key is the store's now, within the cache time.
        assert (await replica.writing_key(KEY, fresh=True)).header not in (before.header, after.header)

    asyncio.run(scenario())


def test_rotation_adds_a_kek_and_rewrap_retires_the_old_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = DirectoryDataKeyStore(tmp_path / "deks")
        folder = tmp_path / "kek"
        old = _keyring(folder, "2026-11")
        raw = await _sealed(Sealer(old, store), KEY, "m1", SENTENCE)
        rotated = _keyring(folder, "2026-12")
        assert rotated.newest_kid == "2026-12"
        # Old data still reads; a new unit's key is wrapped with the newest KEK.
        assert len(await Sealer(rotated, store).open(KEY, [raw])) == 1
        await Sealer(rotated, store).writing_key("mem:shared:ops:c1")
        kids = {r.unit: r.kid for r in await store.records()}
        assert kids == {"team/support": "2026-11", "shared:ops": "2026-12"}
        assert await rewrap(rotated, store) == (1, 1)
        assert {r.kid for r in await store.records()} == {"2026-12"}
        (folder / "2026-11").unlink()
        assert len(await Sealer(Keyring.load(folder), store).open(KEY, [raw])) == 1
        # A KEK removed before the re-wrap is a typed 503, never a new key.
        _keyring(tmp_path / "other", "2027-01")
        with pytest.raises(DataKeyUnavailable):
            await Sealer(Keyring.load(tmp_path / "other"), store).open(KEY, [raw])

    asyncio.run(scenario())


def test_a_wrapped_key_moved_to_another_unit_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = DirectoryDataKeyStore(tmp_path / "deks")
        keyring = _keyring(tmp_path / "kek", "k1")
        sealer = Sealer(keyring, store)
        await sealer.writing_key(KEY)
        record = (await store.records())[0]
        moved = type(record)("shared:ops", record.dek_id, record.kid, record.wrapped, record.created)
        await store.create(moved)
        with pytest.raises(SealedEntryInvalid):
            await Sealer(keyring, store).writing_key("mem:shared:ops:c1")

    asyncio.run(scenario())


def test_a_keyring_refuses_bad_keys(tmp_path: Path) -> None:
    (tmp_path / "short").write_text("abcd")
    with pytest.raises(ValueError, match="32 bytes"):
        Keyring.load(tmp_path)
    (tmp_path / "short").write_text("not hex at all" * 5)
    with pytest.raises(ValueError, match="not hex"):
        Keyring.load(tmp_path)


def test_the_rewrap_command_uses_the_proxys_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "kek"
    store = DirectoryDataKeyStore(tmp_path / "deks")
    asyncio.run(Sealer(_keyring(folder, "2026-11"), store).writing_key(KEY))
    assert datakeys.main(["new-key"]) == 0
    (folder / "2026-12").write_text(capsys.readouterr().out)
    monkeypatch.setenv(env.SEALING_KEYRING, str(folder))
    monkeypatch.setenv(env.SEALING_KEY_STORE, "directory")
    monkeypatch.setenv(env.SEALING_KEY_DIR, str(tmp_path / "deks"))
    assert datakeys.main(["rewrap"]) == 0
    assert "re-wrapped 1 data keys; 0 already under the newest key" in capsys.readouterr().out
    assert [r.kid for r in asyncio.run(store.records())] == ["2026-12"]
    monkeypatch.delenv(env.SEALING_KEYRING)
    with pytest.raises(SystemExit):
        datakeys.main(["rewrap"])


def test_a_forked_process_never_seals_with_its_parents_nonces() -> None:
    """Nonces are drawn a batch at a time: a child forked with part of a batch left must draw its own
    (the same nonce under the same key would reveal both texts)."""
    parent = sealing._nonce()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child process)
        os.close(read_end)
        os.write(write_end, b"".join(sealing._nonce() for _ in range(4)))
        os._exit(0)
    os.close(write_end)
    drawn = os.read(read_end, 1024)
    os.close(read_end)
    assert os.waitpid(child, 0)[1] == 0
    children = {drawn[i : i + 12] for i in range(0, len(drawn), 12)}
    left = {sealing._nonce() for _ in range(8)}
    assert len(children) == 4 and not children & (left | {parent})
