"""Encryption at rest: the proxy seals what an entry says before it reaches Valkey and opens it on read.

A stored entry keeps its id and version in clear, where the scripts find them (and the stamps the scripts
write after them: ``rewoundAt``, ``idempotencyKey``, the conversation's random ``life`` id), and seals the
rest (role, content, author, time and whatever else the entry carries) with AES-256-GCM under its unit's
data key (``datakeys``), the sealed part in raw bytes after the clear head:

    {"id":"<id>","v":<version>,"sealed":<0x02, DEK id (8 bytes), nonce (12), ciphertext+tag>

No script reads past the clear head (their patterns are anchored to it), so the sealed part need not be
text: in base64 it would be a third larger, and every read would carry that third from Valkey, through its
scripts and the proxy's socket. A clear head is JSON text without control characters (ids and keys are
validated), and so is an entry stored unsealed, so ``,"sealed":`` then a control character (the format
byte, 0x02; another is refused) marks where a sealed part starts. Entries sealed before were stored in
base64, in a JSON string; they are still read:

    {"id":"<id>","v":<version>,"sealed":"<base64: 0x01, DEK id (8 bytes), nonce (12), ciphertext+tag>"}

The associated data binds the ciphertext to the Valkey key of its conversation, the entry's id and the
format byte and DEK id, so a sealed entry copied to another conversation (or another id) does not open: it is refused
(``SealedEntryInvalid``), never returned. The version is not bound: the append script assigns it after the
proxy sealed the entry, and a replace renumbers every entry. What the version orders is no secret.

Opening an entry rebuilds the stored form the proxy always answered, ``{"id":..,"v":..,"role":..}``, so
search, redaction (which runs before sealing), token budgets and summaries work on it unchanged. An entry
stored before sealing was turned on (no ``sealed`` field) is read as it is.

Erasure destroys the unit's DEK. Each replica caches unwrapped DEKs for ``cache_seconds`` (bounded in
number), so a replica may still hold an erased unit's DEK after the erasure. It never stores with it: every
write that seals names the DEK it sealed with, and Valkey refuses it, in the write's own step, when that
DEK is no longer the one the unit writes with (``store``: the unit's data key mark, which the erasure moves
on before and after destroying the key). The writer then asks the store for the unit's current DEK
(``writing_key(..., fresh=True)``: a new one, made now, after an erasure), seals again and retries. An
entry whose DEK is not the unit's current one is an erased entry: reads leave it out.

An agent reads the same window every turn, two entries moved on, so each replica remembers the entries
its reads opened, per conversation, for as long as their unit's DEK is the current one (``_Opened``):
opening is an AEAD call per entry, remembering one a dict lookup, and a read that
repeats or moves on the last one is matched against it by comparing bytes (no hash of each entry).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sessionmem_core import env
from sessionmem_core.errors import SealedEntryInvalid
from sessionmem_core.keys import data_key_space, data_key_unit
from sessionmem_proxy.datakeys import (
    DEK_ID_BYTES,
    NONCE_BYTES,
    Closer,
    DataKeyStore,
    Keyring,
    KeyWrapper,
    key_store_from_settings,
    new_data_key,
)

if TYPE_CHECKING:
    from sessionmem_core.env import ProxySettings
    from sessionmem_proxy.kubeapi import KubeAPI

# The format byte in front of the DEK id: the sealed part of an entry in raw bytes (what is stored now), or
# in base64 (entries stored before, and a conversation's sealed title and labels, which are text).
_FORMAT_RAW = b"\x02"
_FORMAT_BASE64 = b"\x01"
_HEADER_BYTES = 1 + DEK_ID_BYTES
# What the scripts stamp on a stored entry after its id and version, and read there (``store``): kept in
# clear, in front of the sealed part, in this order.
_CLEAR_STAMPS = rb'(?:,"rewoundAt":\d+)?(?:,"idempotencyKey":"[^"]*")?(?:,"life":"[^"]*")?'
# A sealed entry: its clear head, then ``,"sealed":`` and the sealed part, raw (its first byte the format
# byte: a control character, which starts no JSON value), or in base64 in a JSON string closed by '"}'.
_SEALED_KEY = b',"sealed":'
_SEALED_KEY_BYTES = len(_SEALED_KEY)
_SEALED_MARK = b',"sealed":"'
_MARK_OFFSET = len(_SEALED_MARK) - 1  # from the sealed part's mark to the quote that opens its base64
_OPENED = re.compile(rb'^(\{"id":"([^"]*)","v":\d+' + _CLEAR_STAMPS + rb"),(.*)$", re.S)
# A reader that meets a DEK id other than the cached one asks the store again, at most this often per unit
# (counted from the last time such a meeting asked it, not from the fetch: a key cached a moment before the
# unit's key changed is asked again at once).
_REFRESH_FLOOR_SECONDS = 1.0
DEFAULT_CACHE_SECONDS = 30.0
DEFAULT_CACHE_UNITS = 10_000
# Opened entries a replica keeps, stored form and opened form counted (``_Opened``).
DEFAULT_OPENED_BYTES = env.DEFAULT_SEALING_OPENED_BYTES
# A conversation's memo starts over once it holds more than this many times the entries of a read, plus
# a few (the summary, a pop's entry): what slid out of the window is not read again.
_MEMO_SLACK = 4
_MEMO_SLACK_ENTRIES = 64


@dataclass(slots=True)
class DataKey:
    """A unit's current DEK, unwrapped (in memory only)."""

    unit: str
    header: bytes  # the base64 format byte + DEK id (sealed titles and labels; entries sealed before)
    aead: AESGCM
    dek_id: str  # the DEK id as its record and the unit's data key mark name it (hex)
    raw_header: bytes  # the raw format byte + DEK id (entries sealed now)


@dataclass(slots=True)
class _Opened:
    """What reads of one conversation opened under its unit's current DEK (``header``): each stored entry
    (the exact bytes Valkey holds, clear head and sealed part) to the entry as the proxy answers it.

    A memo of ``open``, not a second store: an entry opens to the same bytes for as long as its bytes,
    its conversation and its DEK are the same, and only then is it answered from here. A changed byte is
    another entry, which opens (or fails) afresh; another conversation has its own memo, so an entry
    copied there still does not open; and the memo is dropped as soon as the unit's current DEK is no
    longer ``header``: at once on the replica that erased it, on the others when their cached key is
    asked again (``cache_seconds``), the bound already set for the DEK itself. Nor does it outlive the
    conversation's reads: a memo not read for ``cache_seconds`` is dropped (a deleted conversation's
    text does not stay in memory until the byte bound pushes it out)."""

    unit: str
    header: bytes
    entries: dict[bytes, bytes]
    size: int  # the entries' bytes, stored and opened, and the window's
    read_at: float
    # The last read's entries as stored, in order, and as answered: the next read (the same window, or
    # moved on by a turn) is matched against it by comparing bytes, without hashing each entry again.
    window: list[bytes] = field(default_factory=list)
    answer: list[bytes] = field(default_factory=list)
    window_size: int = 0

    def aligned(self, raw_entries: list[bytes]) -> int:
        """How many of ``raw_entries``, from the first, are the last window's entries from some point on
        (byte for byte, in order): answered by ``answer`` from that point."""
        window = self.window
        if not window:
            return 0
        try:
            shift = window.index(raw_entries[0])
        except ValueError:
            return 0
        overlap = len(window) - shift
        return overlap if raw_entries[:overlap] == window[shift:] else 0


@dataclass(slots=True)
class _Cached:
    key: DataKey | None  # None: the unit has no DEK (never sealed anything, or erased)
    fetched: float
    refreshed: float  # when a reader that met another DEK id last asked the store (``_refreshed``)


def _entry_context_prefix(conversation_key: str) -> bytes:
    return b"sessionmem-entry\0" + conversation_key.encode() + b"\0"


def sealed_context(conversation_key: str, entry_id: str | bytes, header: bytes) -> bytes:
    """The associated data of a sealed entry: what it is bound to."""
    entry = entry_id.encode() if isinstance(entry_id, str) else entry_id
    return _entry_context_prefix(conversation_key) + entry + b"\0" + header


def field_context(conversation_key: str, name: str, header: bytes) -> bytes:
    """The associated data of a sealed catalogue field (a title, labels): its conversation and name."""
    return b"sessionmem-field\0" + conversation_key.encode() + b"\0" + name.encode() + b"\0" + header


_FIELD_PREFIX = "sealed:"

# Nonces, drawn from the OS's random source a batch at a time (one system call per batch instead of per
# entry; as random as one at a time). A forked process must never use a nonce its parent may use too: under
# the same key that would reveal both plain texts' XOR and the key's authentication secret.
_NONCE_BATCH = 256
_nonces: list[bytes] = []
os.register_at_fork(after_in_child=_nonces.clear)


def _nonce() -> bytes:
    """A fresh random 96-bit nonce. ``list.pop`` is atomic, so threads may share the batch."""
    try:
        return _nonces.pop()
    except IndexError:
        batch = os.urandom(NONCE_BYTES * _NONCE_BATCH)
        _nonces.extend(batch[i : i + NONCE_BYTES] for i in range(0, len(batch), NONCE_BYTES))
        return _nonces.pop()


class Sealer:
    """Seals and opens entries, with a bounded cache of unwrapped DEKs (one per unit)."""

    def __init__(
        self,
        wrapper: KeyWrapper,
        store: DataKeyStore,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
        cache_units: int = DEFAULT_CACHE_UNITS,
        clock: Callable[[], float] = time.monotonic,
        opened_bytes: int = DEFAULT_OPENED_BYTES,
    ) -> None:
        self.wrapper = wrapper
        self.keys = store
        self._ttl = cache_seconds
        self._max = cache_units
        self._clock = clock
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        # Opened entries by conversation, least recently read first, bounded in bytes (0: none kept).
        self._opened: OrderedDict[str, _Opened] = OrderedDict()
        self._opened_bytes = 0
        self._opened_max = opened_bytes

    def _remember(self, unit: str, key: DataKey | None, refreshed: bool = False) -> DataKey | None:
        now = self._clock()
        self._cache[unit] = _Cached(key, now, now if refreshed else float("-inf"))
        self._cache.move_to_end(unit)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return key

    async def _fetch(self, unit: str, refreshed: bool = False) -> DataKey | None:
        record = await self.keys.load(unit)
        if record is None:
            return self._remember(unit, None, refreshed)
        dek = await self.wrapper.unwrap(record)
        return self._remember(unit, _data_key(unit, record.dek_id, dek), refreshed)

    async def _current(self, unit: str) -> DataKey | None:
        cached = self._cache.get(unit)
        if cached is not None and self._clock() - cached.fetched < self._ttl:
            return cached.key
        return await self._fetch(unit)

    def cached_writing_key(self, conversation_key: str) -> DataKey | None:
        """``writing_key`` when this replica has it cached (no coroutine: the hot path), else None."""
        cached = self._cache.get(data_key_unit(conversation_key))
        if cached is not None and cached.key is not None and self._clock() - cached.fetched < self._ttl:
            return cached.key
        return None

    async def writing_key(self, conversation_key: str, fresh: bool = False) -> DataKey:
        """The DEK new entries of this conversation are sealed with; the unit's first write makes it.
        ``fresh``: asked of the store now, not taken from the cache (the store refused the cached one)."""
        unit = data_key_unit(conversation_key)
        key = await self._fetch(unit) if fresh else await self._current(unit)
        if key is not None:
            return key
        record, dek = await new_data_key(self.wrapper, unit)
        stored = await self.keys.create(record)
        if stored.dek_id != record.dek_id:  # another replica made the unit's key first: use theirs
            dek = await self.wrapper.unwrap(stored)
        made = _data_key(unit, stored.dek_id, dek)
        self._remember(unit, made)
        return made

    @staticmethod
    def seal(key: DataKey, conversation_key: str, entry_id: str, body: bytes) -> bytes:
        """What follows the id and version of a stored entry (``,"sealed":`` and the sealed part) for the
        entry whose fields other than id and version are the JSON object ``body``."""
        return Sealer.sealing(key, conversation_key)(entry_id, body)

    @staticmethod
    def sealing(key: DataKey, conversation_key: str) -> Callable[[str, bytes], bytes]:
        """``seal`` for the entries of one write to ``conversation_key``: what they share of the associated
        data is built once."""
        prefix, header, encrypt = _entry_context_prefix(conversation_key), key.raw_header, key.aead.encrypt
        mark = b',"sealed":' + header

        def seal(entry_id: str, body: bytes) -> bytes:
            nonce = _nonce()
            return mark + nonce + encrypt(nonce, body, prefix + entry_id.encode() + b"\0" + header)

        return seal

    @staticmethod
    def reseal(key: DataKey, conversation_key: str, opened: bytes) -> bytes:
        """An opened entry (as ``open`` answers it) sealed anew for ``conversation_key``: what a fork
        stores of the entries it copies (a sealed entry is bound to its conversation and does not move)."""
        match = _OPENED.match(opened)
        if match is None:
            raise SealedEntryInvalid("an entry to seal is not in the stored form")
        return match.group(1) + Sealer.seal(key, conversation_key, match.group(2).decode(), b"{" + match.group(3))

    async def open(self, conversation_key: str, raw_entries: Sequence[bytes]) -> list[bytes]:
        """The entries as the proxy answers them, opened; entries sealed with an erased DEK left out.
        Fail closed: an entry that does not open under its conversation and id is SealedEntryInvalid.
        An entry this replica opened for the same conversation under the unit's current DEK is answered
        from the conversation's memo (``_Opened``) instead of being opened again."""
        if not raw_entries:
            return []
        raws = raw_entries if isinstance(raw_entries, list) else list(raw_entries)
        now = self._clock()
        self._sweep_opened(now)
        memo = self._opened.get(conversation_key)
        head = 0  # the leading entries the memo's last window holds (answered from it)
        if memo is not None:
            # The common read: every entry opened before, under the unit's DEK as cached now.
            cached = self._cache.get(memo.unit)
            if (
                cached is not None
                and cached.key is not None
                and cached.key.header == memo.header
                and now - cached.fetched < self._ttl
            ):
                head = memo.aligned(raws)
                shift = len(memo.window) - head
                get = memo.entries.get
                tail = [get(raw) for raw in raws[head:]] if head else [get(raw) for raw in raws]
                if None not in tail:
                    memo.read_at = now
                    self._opened.move_to_end(conversation_key)
                    if head == len(raws) and not shift:
                        return list(memo.answer)  # the same window as the last read
                    answered = memo.answer[shift:] + cast(list[bytes], tail) if head else cast(list[bytes], tail)
                    self._remember_window(conversation_key, memo, raws, answered, head)
                    return list(answered)
        unit = data_key_unit(conversation_key)
        key = initial = await self._current(unit)
        if memo is not None and (key is None or memo.header != key.header):
            self._forget_opened(conversation_key)
            memo, head = None, 0
        remembered = memo.entries if memo is not None else {}
        opened: list[bytes] = memo.answer[len(memo.window) - head :] if memo is not None and head else []
        fresh: list[tuple[bytes, bytes]] = []
        context = _entry_context_prefix(conversation_key)  # the part every entry here shares
        for raw in raws[head:] if head else raws:
            if remembered:
                hit = remembered.get(raw)
                if hit is not None:
                    opened.append(hit)
                    continue
            # The first ',"sealed":' ends the clear head of a sealed entry (a head holds none). In an entry stored
            # unsealed it can only be a key of its item, followed by a JSON value, never by a control character.
            head_end = raw.find(_SEALED_KEY)
            start = head_end + _SEALED_KEY_BYTES
            first = raw[start : start + 1] if head_end >= 0 else b""
            if b"" < first < b" ":  # sealed raw: its format byte
                if first != _FORMAT_RAW:
                    raise SealedEntryInvalid("a sealed entry has an unknown format")
                blob: bytes | memoryview = memoryview(raw)[start:]
                base64_form = False
            else:
                # Sealed before in base64, the last string: ',"sealed":"...."}'. An entry stored before sealing
                # was turned on never ends with '"}': its last field is a number (``ts``) or an object (``item``).
                quote = raw.rfind(b'"', 0, len(raw) - 2)
                if not raw.endswith(b'"}') or not raw.startswith(_SEALED_MARK, quote - _MARK_OFFSET):
                    opened.append(raw)  # stored before sealing was turned on
                    continue
                head_end = quote - _MARK_OFFSET
                try:
                    blob = binascii.a2b_base64(raw[quote + 1 : -2], strict_mode=True)
                except binascii.Error as exc:
                    raise SealedEntryInvalid("a sealed entry is malformed") from exc
                if blob[:1] != _FORMAT_BASE64:
                    raise SealedEntryInvalid("a sealed entry has an unknown format")
                base64_form = True
            id_end = raw.find(b'"', 7)
            if not raw.startswith(b'{"id":"') or not 7 <= id_end < head_end or len(blob) < _HEADER_BYTES + NONCE_BYTES:
                raise SealedEntryInvalid("a sealed entry is malformed")
            header = bytes(blob[:_HEADER_BYTES])
            if key is None or (key.header if base64_form else key.raw_header) != header:
                key = await self._refreshed(unit, key)
                if key is None or (key.header if base64_form else key.raw_header) != header:
                    continue  # sealed with a DEK that was destroyed: erased
            try:
                plain = key.aead.decrypt(
                    blob[_HEADER_BYTES : _HEADER_BYTES + NONCE_BYTES],
                    blob[_HEADER_BYTES + NONCE_BYTES :],
                    context + raw[7:id_end] + b"\0" + header,
                )
            except InvalidTag as exc:
                raise SealedEntryInvalid(f"an entry of {conversation_key!r} does not open: altered or moved") from exc
            entry = raw[:head_end] + b"," + plain[1:]
            opened.append(entry)
            fresh.append((raw, entry))
        if (fresh or memo is not None) and key is not None and key is initial and self._opened_max:
            # (A key asked again halfway may differ from the one the entries before were opened with.)
            memo = self._remember_opened(conversation_key, unit, key.header, fresh, len(raws))
            self._remember_window(conversation_key, memo, raws, list(opened), head)
        return opened

    def _remember_window(
        self, conversation_key: str, memo: _Opened, raws: list[bytes], answer: list[bytes], head: int
    ) -> None:
        """Keep a read of two entries or more, each answered (``answer``, the memo's own list from now on),
        as the memo's window, its first ``head`` entries the last window's from some point on; a summary's
        or a pop's one entry leaves the window the agent's reads move along. Its bytes count with the
        memo's."""
        if len(raws) < 2 or len(answer) != len(raws) or self._opened.get(conversation_key) is not memo:
            return
        if head and len(memo.window) >= head:  # (a memo that started over holds no window)
            # Moved on: the last window's entries from ``shift`` on, then the new ones (counted alone).
            window = memo.window
            shift = len(window) - head
            size = memo.window_size - sum(map(len, window[:shift])) + sum(map(len, raws[head:]))
            window = window[shift:] + raws[head:]
        else:
            window, size = list(raws), sum(map(len, raws))
        self._opened_bytes += size - memo.window_size
        memo.size += size - memo.window_size
        memo.window, memo.answer, memo.window_size = window, answer, size
        self._bound_opened()

    def _remember_opened(
        self, conversation_key: str, unit: str, header: bytes, fresh: list[tuple[bytes, bytes]], window: int
    ) -> _Opened:
        memo = self._opened.get(conversation_key)
        if memo is None or memo.header != header:
            if memo is not None:
                self._forget_opened(conversation_key)
            memo = self._opened[conversation_key] = _Opened(unit, header, {}, 0, self._clock())
        elif len(memo.entries) + len(fresh) > _MEMO_SLACK * window + _MEMO_SLACK_ENTRIES:
            # Entries that slid out of the window are not read again: start over from this read's.
            self._opened_bytes -= memo.size
            memo.entries, memo.size, memo.window, memo.answer, memo.window_size = {}, 0, [], [], 0
        size = 0
        for raw, entry in fresh:
            memo.entries[raw] = entry
            size += len(raw) + len(entry)
        memo.size += size
        memo.read_at = self._clock()
        self._opened_bytes += size
        self._opened.move_to_end(conversation_key)
        self._bound_opened()
        return memo

    def _bound_opened(self) -> None:
        """Drop the least recently read memos while the memos hold more than their bound."""
        while self._opened_bytes > self._opened_max and self._opened:
            _, dropped = self._opened.popitem(last=False)
            self._opened_bytes -= dropped.size

    def _sweep_opened(self, now: float) -> None:
        """Drop the memos not read for ``cache_seconds`` (least recently read first: they lead)."""
        opened = self._opened
        while opened:
            oldest = next(iter(opened.values()))
            if now - oldest.read_at < self._ttl:
                return
            opened.popitem(last=False)
            self._opened_bytes -= oldest.size

    def _forget_opened(self, conversation_key: str) -> None:
        memo = self._opened.pop(conversation_key, None)
        if memo is not None:
            self._opened_bytes -= memo.size

    @staticmethod
    def seal_field(key: DataKey, conversation_key: str, name: str, text: str) -> str:
        """A conversation's catalogue text (its title, its labels as JSON) as stored: sealed like its
        entries, under the same data key (``writing_key``), bound to the conversation and the field's name."""
        nonce = _nonce()
        sealed = key.aead.encrypt(nonce, text.encode(), field_context(conversation_key, name, key.header))
        return _FIELD_PREFIX + base64.b64encode(key.header + nonce + sealed).decode()

    async def open_field(self, conversation_key: str, name: str, stored: str) -> str | None:
        """The text ``seal_field`` sealed; None when its data key was erased; text stored before sealing
        was turned on as it is. Fail closed like ``open``."""
        if not stored.startswith(_FIELD_PREFIX):
            return stored
        try:
            blob = base64.b64decode(stored[len(_FIELD_PREFIX) :], validate=True)
        except binascii.Error as exc:
            raise SealedEntryInvalid("a sealed field is not base64") from exc
        header = blob[:_HEADER_BYTES]
        if len(blob) < _HEADER_BYTES + NONCE_BYTES or header[:1] != _FORMAT_BASE64:
            raise SealedEntryInvalid("a sealed field has an unknown format")
        unit = data_key_unit(conversation_key)
        key = await self._current(unit)
        if key is None or key.header != header:
            key = await self._refreshed(unit, key)
            if key is None or key.header != header:
                return None
        nonce, body = blob[_HEADER_BYTES : _HEADER_BYTES + NONCE_BYTES], blob[_HEADER_BYTES + NONCE_BYTES :]
        try:
            return key.aead.decrypt(nonce, body, field_context(conversation_key, name, header)).decode()
        except InvalidTag as exc:
            raise SealedEntryInvalid(f"the {name} of {conversation_key!r} does not open: altered or moved") from exc

    async def _refreshed(self, unit: str, key: DataKey | None) -> DataKey | None:
        """The unit's DEK asked of the store again (another replica may have made a new one since this one
        cached it), unless it was asked within the refresh floor."""
        cached = self._cache.get(unit)
        if cached is not None and self._clock() - cached.refreshed < _REFRESH_FLOOR_SECONDS:
            return key
        return await self._fetch(unit, refreshed=True)

    async def erase(self, unit: str) -> list[str]:
        """Destroy the DEK of ``unit`` (of every unit of an agent's or registry's space, when ``unit`` is
        the space itself: an agent's erasure takes its users' buckets) and forget it here; answers the
        units whose DEK was destroyed."""
        whole_space = data_key_space(unit) == unit
        destroyed = await self.keys.destroy(unit, whole_space)
        space = data_key_space(unit)
        for cached in list(self._cache):
            if cached == unit or (whole_space and data_key_space(cached) == space):
                del self._cache[cached]
        for conversation_key, memo in list(self._opened.items()):
            if memo.unit == unit or (whole_space and data_key_space(memo.unit) == space):
                self._forget_opened(conversation_key)
        return destroyed


def _data_key(unit: str, dek_id: str, dek: bytes) -> DataKey:
    dek_id_bytes = bytes.fromhex(dek_id)
    return DataKey(unit, _FORMAT_BASE64 + dek_id_bytes, AESGCM(dek), dek_id, _FORMAT_RAW + dek_id_bytes)


def sealer_from_settings(
    settings: ProxySettings, kube: Callable[[ProxySettings], KubeAPI]
) -> tuple[Sealer | None, Closer | None]:
    """The proxy's sealer and what closes it, or (None, None) when sealing is off (no keyring configured).
    The KEK keyring is read now: a bad key stops the proxy at start-up instead of failing requests."""
    if settings.sealing_keyring is None:
        return None, None
    wrapper = Keyring.load(Path(settings.sealing_keyring))
    store, closer = key_store_from_settings(settings, kube)
    return Sealer(wrapper, store, settings.sealing_cache_seconds, opened_bytes=settings.sealing_opened_bytes), closer
