"""Conversation storage on Valkey: one list per conversation, every write one atomic server-side script.

Entries are stored as JSON text built here with a fixed field order, ``{"id":..,"v":..,"role":..,...}``,
so reads can return the stored bytes as they are and the scripts can find an entry's id and version
without a JSON decoder. ``v`` is the conversation version the entry was written at; the version of a
conversation is the ``v`` of its newest entry. Every append adds one to it, so it keeps moving after the
cap trims old entries (an entry count would stop at the cap).

Used by the proxy, and by a launcher configured to talk to Valkey directly (no proxy).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError
from valkey.exceptions import ValkeyError

from sessionmem_core.api import SUMMARY_ID_PREFIX
from sessionmem_core.errors import BackendUnavailable, VersionConflict
from sessionmem_core.ids import new_message_id

# Append: KEYS[1] the conversation; ARGV = cap, ttl, the client's first message id ('' when the ids were
# minted here, so no retry is possible), then (id, rest-of-entry) pairs. A batch whose first id is already
# stored is a retry: nothing is written and the current version is returned.
_APPEND = """
local key = KEYS[1]
local cap = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local tail = redis.call('LINDEX', key, -1)
local v = 0
if tail then v = tonumber(string.match(tail, '^{"id":"[^"]*","v":(%d+)')) or 0 end
if ARGV[3] ~= '' and tail then
  local probe = '{"id":"' .. ARGV[3] .. '",'
  local plen = string.len(probe)
  local stored = redis.call('LRANGE', key, 0, -1)
  for i = #stored, 1, -1 do
    if string.sub(stored[i], 1, plen) == probe then
      return {v, 0, redis.call('LLEN', key)}
    end
  end
end
v = v + 1
local batch = {}
for i = 4, #ARGV, 2 do
  batch[#batch + 1] = '{"id":"' .. ARGV[i] .. '","v":' .. v .. ARGV[i + 1]
end
redis.call('RPUSH', key, unpack(batch))
redis.call('LTRIM', key, -cap, -1)
redis.call('EXPIRE', key, ttl)
return {v, #batch, redis.call('LLEN', key)}
"""

# Replace (seed): ARGV = expected version ('*' for any), cap, ttl, then (id, rest) pairs.
_REPLACE = """
local key = KEYS[1]
local tail = redis.call('LINDEX', key, -1)
local v = 0
if tail then v = tonumber(string.match(tail, '^{"id":"[^"]*","v":(%d+)')) or 0 end
if ARGV[1] ~= '*' and tonumber(ARGV[1]) ~= v then
  return {-1, v}
end
v = v + 1
local batch = {}
for i = 4, #ARGV, 2 do
  batch[#batch + 1] = '{"id":"' .. ARGV[i] .. '","v":' .. v .. ARGV[i + 1]
end
redis.call('DEL', key)
redis.call('RPUSH', key, unpack(batch))
redis.call('LTRIM', key, -tonumber(ARGV[2]), -1)
redis.call('EXPIRE', key, tonumber(ARGV[3]))
return {v, math.min(#batch, tonumber(ARGV[2]))}
"""

_DELETE = """
local n = redis.call('LLEN', KEYS[1])
redis.call('DEL', KEYS[1])
return n
"""

# Info: length, newest entry (for the version), remaining TTL in ms.
_INFO = """
return {redis.call('LLEN', KEYS[1]), redis.call('LINDEX', KEYS[1], -1) or '', redis.call('PTTL', KEYS[1])}
"""

# Read with summary: the window, plus the oldest entry when it is a rolling summary outside the window.
_READ_WITH_SUMMARY = """
local window = redis.call('LRANGE', KEYS[1], -tonumber(ARGV[1]), -1)
local n = redis.call('LLEN', KEYS[1])
local head = ''
if n > #window then
  head = redis.call('LINDEX', KEYS[1], 0) or ''
  local marker = '{"id":"' .. ARGV[2]
  if string.sub(head, 1, #marker) ~= marker then head = '' end
end
return {head, window}
"""

_VERSION = re.compile(rb'^\{"id":"[^"]*","v":(\d+)')


def version_of(raw_entry: bytes) -> int:
    match = _VERSION.match(raw_entry)
    return int(match.group(1)) if match else 0


@dataclass(frozen=True, slots=True)
class NewEntry:
    role: str
    content: str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class AppendResult:
    version: int
    stored: int
    length: int = 0

    @property
    def duplicate(self) -> bool:
        return self.stored == 0


@dataclass(frozen=True, slots=True)
class ReadResult:
    version: int
    raw_entries: list[bytes]
    raw_summary: bytes | None = None

    def entries_json(self) -> bytes:
        """The entries as a JSON array, made of the stored bytes without decoding them."""
        return b"[" + b",".join(self.raw_entries) + b"]"


class ValkeyLike(Protocol):
    """What the store needs of a client: satisfied by valkey-py's standalone and cluster clients."""

    def register_script(self, script: str) -> Any: ...

    def lrange(self, name: str, start: int, end: int) -> Any: ...

    def ping(self) -> Any: ...

    def scan(self, cursor: int = 0, match: str | None = None, count: int | None = None) -> Any: ...


def _entry_args(entries: Sequence[NewEntry], author: str, now_ms: int) -> list[str]:
    args: list[str] = []
    for entry in entries:
        rest = orjson.dumps({"role": entry.role, "content": entry.content, "author": author, "ts": now_ms})
        # The id was validated (no quotes, no control characters), so it is safe inside a JSON string.
        args.append(entry.id or new_message_id())
        args.append("," + rest[1:].decode())
    return args


class ConversationStore:
    """Atomic operations on one conversation key; backend failures surface as BackendUnavailable."""

    def __init__(self, client: ValkeyLike) -> None:
        self._client = client
        self._append = client.register_script(_APPEND)
        self._replace = client.register_script(_REPLACE)
        self._delete = client.register_script(_DELETE)
        self._info = client.register_script(_INFO)
        self._read_with_summary = client.register_script(_READ_WITH_SUMMARY)

    async def append(
        self, key: str, entries: Sequence[NewEntry], author: str, cap: int, ttl_seconds: int
    ) -> AppendResult:
        probe = entries[0].id or ""
        args = [cap, ttl_seconds, probe, *_entry_args(entries, author, _now_ms())]
        version, stored, length = await self._call(self._append, key, args)
        return AppendResult(version=int(version), stored=int(stored), length=int(length))

    async def read(self, key: str, limit: int) -> ReadResult:
        if limit <= 0:
            raw: list[bytes] = await self._guard(self._client.lrange(key, -1, -1))
            return ReadResult(version=version_of(raw[0]) if raw else 0, raw_entries=[])
        raw = await self._guard(self._client.lrange(key, -limit, -1))
        return ReadResult(version=version_of(raw[-1]) if raw else 0, raw_entries=raw)

    async def read_with_summary(self, key: str, limit: int) -> ReadResult:
        if limit <= 0:
            return await self.read(key, 0)
        head, window = await self._call(self._read_with_summary, key, [limit, SUMMARY_ID_PREFIX])
        version = version_of(window[-1]) if window else 0
        return ReadResult(version=version, raw_entries=list(window), raw_summary=head or None)

    async def info(self, key: str) -> tuple[int, int, int | None]:
        """(entries, version, ttl in seconds or None when the key does not exist)."""
        length, tail, pttl = await self._call(self._info, key, [])
        ttl = None if int(pttl) < 0 else max(1, (int(pttl) + 999) // 1000)
        return int(length), version_of(tail) if tail else 0, ttl

    async def scan(self, match: str, cursor: int, count: int) -> tuple[int, list[str]]:
        next_cursor, keys = await self._guard(self._client.scan(cursor=cursor, match=match, count=count))
        return int(next_cursor), [k.decode() if isinstance(k, bytes) else str(k) for k in keys]

    async def read_all(self, key: str) -> ReadResult:
        raw: list[bytes] = await self._guard(self._client.lrange(key, 0, -1))
        return ReadResult(version=version_of(raw[-1]) if raw else 0, raw_entries=raw)

    async def read_range(self, key: str, start: int, stop: int) -> list[bytes]:
        """Entries ``start`` to ``stop`` (LRANGE indexes, inclusive): one page of an export."""
        raw: list[bytes] = await self._guard(self._client.lrange(key, start, stop))
        return raw

    async def replace(
        self,
        key: str,
        entries: Sequence[NewEntry],
        author: str,
        expected_version: int | None,
        cap: int,
        ttl_seconds: int,
    ) -> AppendResult:
        expected = "*" if expected_version is None else str(expected_version)
        args = [expected, cap, ttl_seconds, *_entry_args(entries, author, _now_ms())]
        version, stored = await self._call(self._replace, key, args)
        if int(version) < 0:
            raise VersionConflict(f"conversation is at version {stored}, not {expected_version}")
        return AppendResult(version=int(version), stored=int(stored))

    async def delete(self, key: str) -> int:
        removed = await self._call(self._delete, key, [])
        return int(removed)

    async def ping(self) -> None:
        await self._guard(self._client.ping())

    async def _call(self, script: Any, key: str, args: list[Any]) -> Any:
        return await self._guard(script(keys=[key], args=args))

    @staticmethod
    async def _guard(awaitable: Any) -> Any:
        try:
            return await awaitable
        except (ValkeyConnectionError, ValkeyTimeoutError, OSError) as exc:
            raise BackendUnavailable(f"memory backend unavailable: {type(exc).__name__}") from exc
        except ValkeyError as exc:
            if "LOADING" in str(exc) or "MASTERDOWN" in str(exc) or "CLUSTERDOWN" in str(exc):
                raise BackendUnavailable(f"memory backend not ready: {exc}") from exc
            raise


def tokenize(text: str) -> set[str]:
    return {t for t in re.findall(r"\w+", text.lower()) if len(t) > 1}


def search_entries(raw_entries: Sequence[bytes], query: str, limit: int) -> list[dict[str, Any]]:
    """Keyword search: entries ranked by how many query terms they contain, newest first on ties."""
    terms = tokenize(query)
    if not terms:
        return []
    scored: list[tuple[int, int, dict[str, Any]]] = []
    for position, raw in enumerate(raw_entries):
        entry = orjson.loads(raw)
        overlap = len(terms & tokenize(str(entry.get("content", ""))))
        if overlap:
            scored.append((overlap, position, entry))
    scored.sort(key=lambda item: (item[0], item[1]), reverse=True)
    return [entry for _, _, entry in scored[:limit]]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
