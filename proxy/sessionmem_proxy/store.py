"""Conversation storage on Valkey: one list per conversation, every write one atomic server-side script.

Entries are stored as JSON text built here with a fixed field order, ``{"id":..,"v":..,"role":..,...}``,
so reads can return the stored bytes as they are and the scripts can find an entry's id and version
without a JSON decoder. ``v`` is the conversation version the entry was written at; the version of a
conversation is the ``v`` of its newest entry. Every append adds one to it, so it keeps moving after the
cap trims old entries (an entry count would stop at the cap).
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, TypeVar

import orjson
from valkey.asyncio.cluster import ValkeyCluster
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import NoScriptError, OutOfMemoryError, ValkeyError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

from sessionmem_core import env
from sessionmem_core.api import SUMMARY_ID_PREFIX
from sessionmem_core.errors import (
    BackendUnavailable,
    ConversationBusy,
    ConversationExists,
    DataKeyUnavailable,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    SessionMemError,
    VersionConflict,
)
from sessionmem_core.keys import (
    data_key_marks,
    data_key_space,
    data_key_unit,
    new_message_id,
    retry_index_of,
    sizes_key_of,
    usage_keys_of,
)
from sessionmem_proxy.resp_client import PipelinedValkey, Session
from sessionmem_proxy.sealing import DataKey, Sealer

_T = TypeVar("_T")

# What turns an entry's id and its fields (a JSON object) into what follows its id and version when it is
# stored: sealed (``sealing.Sealer.seal``), or as they are.
Seal = Callable[[str, bytes], bytes]
# Admits one window read apart from its script (the caller's per-agent limit: it raises to refuse) and
# returns what ends it.
BigRead = Callable[[], Callable[[], None]]

_LOG = logging.getLogger("sessionmem.store")

# How far back an append looks for the ids of a retried batch: the newest RETRY_WINDOW_ENTRIES entries,
# read from the tail in chunks growing from 4 to RETRY_CHUNK_ENTRIES, stopping as soon as every client id
# is found or RETRY_WINDOW_BYTES have been read. They bound the work per append whatever the
# conversation's length (at most the window bytes plus one chunk of entries); a retry is recognised while
# its original is inside that window (docs/lifecycle.md, "Retries"). An append with an idempotency key
# reads the window only when the conversation's retry index (the append script's ``RETRY``) lists its key
# or is missing.
RETRY_WINDOW_ENTRIES = 2 * env.MAX_ENTRIES_PER_APPEND
RETRY_WINDOW_BYTES = 2 * env.MAX_BODY_BYTES
RETRY_CHUNK_ENTRIES = 16

# How long a space's data key marks outlive their last confirmation or erasure (a mark that expired is
# confirmed again by the next write that seals: one more ask of the DEK store), and how many times a writer
# confirms the current DEK against erasures that keep moving the mark on before it gives up (fail closed).
DATA_KEY_MARK_SECONDS = 7 * 24 * 3600
_CONFIRM_ATTEMPTS = 3


class _StaleDataKey(Exception):
    """Internal: Valkey refused a write sealed with a DEK that is not its unit's current one; ``generation``
    is the unit's data key mark, which the writer confirms the current DEK against (``_sealed``)."""

    def __init__(self, generation: int) -> None:
        super().__init__(generation)
        self.generation = generation


# The conversation scripts are Lua functions, so the same code runs alone (one key: any deployment) or
# together with the storage accounting in one script (standalone Valkey, where a script may touch keys of
# any slot): see ``ConversationStore`` and ``_scripts``. Each write function takes its key and where its
# arguments start in ARGV, and answers its reply, then how the accounting counts it: 'add' or 'set', the
# bytes and the TTL; or its reply alone when it wrote nothing.

# The version of a conversation is read from its newest entry: its ``v``, or the ``rewoundAt`` a pop or a
# rewind wrote on it (they are writes, so they move the version on without writing an entry). Every script
# that reads a version uses ``version_of``; ``mark_rewound`` stamps the newest entry, answering the bytes it
# added. The newest entry also carries the id of the conversation's life (``life_of``; ``sessionmem_core.api.etag``):
# a new one (the write's ARGV) when a write creates the conversation, else the one its newest entry had,
# stamped by every write that makes a new newest entry (``restamp``), so it always sits on the newest.
_VERSION_FUNCTIONS = """
local SIZES = nil
local RETRY = nil
local function version_of(entry)
  if not entry then return 0 end
  local v, r = string.match(entry, '^{"id":"[^"]*","v":(%d+),"rewoundAt":(%d+)')
  if v then return math.max(tonumber(v), tonumber(r)) end
  return tonumber(string.match(entry, '^{"id":"[^"]*","v":(%d+)')) or 0
end
local function life_of(entry)
  if not entry then return '' end
  local rest = string.match(string.sub(entry, 1, 1024), '^{"id":"[^"]*","v":%d+(.*)$') or ''
  rest = string.gsub(rest, '^,"rewoundAt":%d+', '', 1)
  rest = string.gsub(rest, '^,"idempotencyKey":"[^"]*"', '', 1)
  return string.match(rest, '^,"life":"([^"]*)"') or ''
end
local function restamp(key, rewound, life)
  local tail = redis.call('LINDEX', key, -1)
  local head, rest = string.match(tail, '^({"id":"[^"]*","v":%d+)(.*)$')
  rest = string.gsub(rest, '^,"rewoundAt":%d+', '', 1)
  local stamps = ''
  if rewound then stamps = ',"rewoundAt":' .. rewound end
  local idem = string.match(rest, '^,"idempotencyKey":"[^"]*"')
  if idem then
    stamps = stamps .. idem
    rest = string.sub(rest, #idem + 1)
  end
  rest = string.gsub(rest, '^,"life":"[^"]*"', '', 1)
  local marked = head .. stamps .. ',"life":"' .. life .. '"' .. rest
  redis.call('LSET', key, -1, marked)
  if SIZES and redis.call('LLEN', SIZES) > 0 then redis.call('LSET', SIZES, -1, #marked) end
  return #marked - #tail
end
local function sizes_push(key, fresh, entries, cap, ttl)
  if not SIZES then return end
  if fresh or redis.call('LLEN', SIZES) > redis.call('LLEN', key) - #entries then redis.call('DEL', SIZES) end
  local sizes = {}
  for i, e in ipairs(entries) do sizes[i] = #e end
  if #sizes > 0 then redis.call('RPUSH', SIZES, unpack(sizes)) end
  redis.call('LTRIM', SIZES, -cap, -1)
  redis.call('EXPIRE', SIZES, ttl)
end
local function sizes_pop(key)
  -- Removing from the newest end moves the retry window back over older entries: the index goes.
  if RETRY then redis.call('DEL', RETRY) end
  if not SIZES then return end
  redis.call('RPOP', SIZES)
  if redis.call('EXISTS', key) == 0 then redis.call('DEL', SIZES) end
end
local function mark_rewound(key, version, life)
  return restamp(key, version, life)
end
local function ttl_of(key)
  return math.max(1, math.floor((redis.call('PTTL', key) + 999) / 1000))
end
"""

# append(key, a): ARGV from ``a`` on holds cap, ttl, window entries, window bytes, chunk, the append's
# idempotency key ('' for none), the expected version ('*' for any), a new life id (used when the append
# creates the conversation), then (id, client?, rest) triples,
# client? '1' when the id came from the client and identifies a retry (a minted id cannot be a retry;
# with an idempotency key ids may repeat). With a key, an append whose key is stored in the retry window
# (on the first entry of its original) is a retry, answered with its original's version and nothing
# stored, whatever the expected version (the original was the write it expected). Otherwise an append
# expecting another version than the conversation's stores nothing: {-1, current version, length}.
# Without a key, each entry is judged on its own: an id already stored in the retry window, or earlier in
# the same batch, is skipped; the rest are stored. Answers {version, stored, length, duplicate ids, bytes
# added (net of what the cap trimmed), 1 when the conversation was new, its life id}.
_APPEND_FUNCTION = """
local function retry_member(idempotency_key)
  return string.sub(redis.sha1hex(idempotency_key), 1, 8)
end
local function append(key, a)
  local cap, ttl, window = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local window_bytes, max_chunk, idem = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), ARGV[a + 5]
  local expected, fresh_life, first = ARGV[a + 6], ARGV[a + 7], a + 8
  local tail = redis.call('LINDEX', key, -1)
  local v = 0
  if tail then v = version_of(tail) end
  local wanted = {}
  local missing = 0
  for i = first, #ARGV, 3 do
    if ARGV[i + 1] == '1' and not wanted[ARGV[i]] then
      wanted[ARGV[i]] = true
      missing = missing + 1
    end
  end
  if idem ~= '' then missing = 1 end
  -- RETRY, the retry index (standalone only): a digest of each key of the conversation's latest keyed
  -- appends (``retry_index_member``), at most as many as the window holds entries, each scored with its
  -- version, kept by this script alone. Every key stamped in the window is in it, as the window only moves
  -- on while the index lives (a pop, a rewind, a replace, a fork and a delete drop it). So a key missing
  -- from it is no retry and no entry is read; a key in it (or one sharing its digest) is looked for in the
  -- entries as before (the cap may have trimmed its original), and so is every key of a conversation with
  -- entries and no index, whose stamps found in the window then make its index.
  local indexing, member = nil, nil
  if idem ~= '' and RETRY then
    member = retry_member(idem)
    if not tail then
      redis.call('DEL', RETRY)
    elseif not redis.call('ZSCORE', RETRY, member) then
      if redis.call('EXISTS', RETRY) == 1 then missing = 0 else indexing = {} end
    end
  end
  local stored_before = {}
  local original = nil
  -- An entry holds the key only if these bytes are in it: a plain search rules most entries out, and the
  -- anchored patterns (several times its cost per entry) run only where it found them; when making the
  -- index, wherever an entry holds any key.
  local idem_mark = ',"idempotencyKey":"' .. idem .. '"'
  local find_mark = indexing and ',"idempotencyKey":"' or idem_mark
  if tail and missing > 0 then
    local limit = math.min(window, redis.call('LLEN', key))
    local from, chunk, seen_bytes = 1, 4, 0
    while from <= limit and missing > 0 and seen_bytes <= window_bytes do
      local to = math.min(from + chunk - 1, limit)
      local part = redis.call('LRANGE', key, -to, -from)
      for j = #part, 1, -1 do
        seen_bytes = seen_bytes + #part[j]
        if idem ~= '' then
          local at, k = nil, nil
          if string.find(part[j], find_mark, 1, true) then
            at, k = string.match(part[j], '^{"id":"[^"]*","v":(%d+),"idempotencyKey":"([^"]*)"')
            if not k then
              at, k = string.match(part[j], '^{"id":"[^"]*","v":(%d+),"rewoundAt":%d+,"idempotencyKey":"([^"]*)"')
            end
          end
          if k == idem then
            original = tonumber(at)
            missing = 0
            break
          elseif k and indexing then
            indexing[#indexing + 1] = at
            indexing[#indexing + 1] = retry_member(k)
          end
        else
          local id = string.match(part[j], '^{"id":"([^"]*)"')
          if id and wanted[id] then
            wanted[id] = nil
            stored_before[id] = true
            missing = missing - 1
          end
        end
      end
      from = to + 1
      chunk = math.min(chunk * 2, max_chunk)
    end
  end
  if original then
    local ids = {}
    for i = first, #ARGV, 3 do ids[#ids + 1] = ARGV[i] end
    return {original, 0, redis.call('LLEN', key), ids, 0, 0, life_of(tail)}
  end
  if expected ~= '*' and tonumber(expected) ~= v then
    return {-1, v, redis.call('LLEN', key), {}, 0, 0, life_of(tail)}
  end
  local batch, rests, duplicates, taken = {}, {}, {}, {}
  local added = 0
  local mark = ''
  if idem ~= '' then mark = ',"idempotencyKey":"' .. idem .. '"' end
  for i = first, #ARGV, 3 do
    local id = ARGV[i]
    if stored_before[id] or (taken[id] and idem == '') then
      duplicates[#duplicates + 1] = id
    else
      taken[id] = true
      batch[#batch + 1] = '{"id":"' .. id .. '","v":' .. (v + 1) .. mark
      rests[#batch] = ARGV[i + 2]
      mark = ''
    end
  end
  local life = life_of(tail)
  if #batch == 0 then
    return {v, 0, redis.call('LLEN', key), duplicates, 0, 0, life}
  end
  if life == '' then life = fresh_life end
  batch[#batch] = batch[#batch] .. ',"life":"' .. life .. '"'
  for k = 1, #batch do
    batch[k] = batch[k] .. rests[k]
    added = added + #batch[k]
  end
  v = v + 1
  local length = redis.call('RPUSH', key, unpack(batch))
  sizes_push(key, not tail, batch, cap, ttl)
  if member then
    if indexing and #indexing > 0 then redis.call('ZADD', RETRY, unpack(indexing)) end
    redis.call('ZADD', RETRY, v, member)
    local keep = math.min(window, cap)
    if redis.call('ZCARD', RETRY) > keep then redis.call('ZREMRANGEBYRANK', RETRY, 0, -keep - 1) end
    redis.call('EXPIRE', RETRY, ttl)
  end
  if length > cap then
    for _, gone in ipairs(redis.call('LRANGE', key, 0, length - cap - 1)) do
      added = added - #gone
    end
    redis.call('LTRIM', key, -cap, -1)
    length = cap
  end
  redis.call('EXPIRE', key, ttl)
  return {v, #batch, length, duplicates, added, tail and 0 or 1, life}, tail and 'add' or 'set', added, ttl, length
end
"""

# replace(key, a): ARGV from ``a`` on holds the expected version ('*' for any), cap, ttl, a new life id, then
# (id, rest) pairs. Answers {version, stored, bytes stored}, or {-1, current version, 0} when the version does
# not match.
_REPLACE_FUNCTION = """
local function replace(key, a)
  local expected, cap, ttl, first = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), a + 4
  local tail = redis.call('LINDEX', key, -1)
  local v = 0
  if tail then v = version_of(tail) end
  if expected ~= '*' and tonumber(expected) ~= v then
    return {-1, v, 0}
  end
  v = v + 1
  local life = life_of(tail)
  if life == '' then life = ARGV[a + 3] end
  local batch = {}
  for i = first, #ARGV, 2 do
    local stamp = ''
    if i + 1 == #ARGV then stamp = ',"life":"' .. life .. '"' end
    batch[#batch + 1] = '{"id":"' .. ARGV[i] .. '","v":' .. v .. stamp .. ARGV[i + 1]
  end
  redis.call('DEL', key)
  if RETRY then redis.call('DEL', RETRY) end
  redis.call('RPUSH', key, unpack(batch))
  sizes_push(key, true, batch, cap, ttl)
  redis.call('LTRIM', key, -cap, -1)
  redis.call('EXPIRE', key, ttl)
  local kept = math.min(#batch, cap)
  local size = 0
  for i = #batch - kept + 1, #batch do size = size + #batch[i] end
  return {v, kept, size}, 'set', size, ttl, kept
end
"""

# pop(key, a): ARGV[a] the expected version ('*' for any), ARGV[a + 1] a new life id (for a newest entry
# without one). Removes the newest entry; the version moves on
# (stamped on the new newest entry), or the conversation is gone when it was the last. Answers {version,
# length, removed entry or '', 1 when one was removed, bytes added (negative), TTL (0: gone)}, or {-1,
# current version} when the version does not match; nothing written when there was nothing to pop.
_POP_FUNCTION = """
local function pop(key, a)
  local expected = ARGV[a]
  local tail = redis.call('LINDEX', key, -1)
  local v = version_of(tail)
  if expected ~= '*' and tonumber(expected) ~= v then return {-1, v} end
  if not tail then return {0, 0, '', 0, 0, 0} end
  local ttl = ttl_of(key)
  local life = life_of(tail)
  if life == '' then life = ARGV[a + 1] end
  redis.call('RPOP', key)
  sizes_pop(key)
  local length = redis.call('LLEN', key)
  if length == 0 then return {0, 0, tail, 1, -#tail, 0}, 'forget', 0, 0 end
  local delta = mark_rewound(key, v + 1, life) - #tail
  return {v + 1, length, tail, 1, delta, ttl}, 'add', delta, ttl, length
end
"""

# rewind(key, a): ARGV[a] the expected version ('*' for any), ARGV[a + 1] the version to go back to, ARGV[a +
# 2] a new life id (for a newest entry without one): the
# entries written after it are dropped, newest first; the version moves on as a pop's does. Answers
# {version, removed, length, bytes added (negative), TTL (0: gone)}, or {-1, current version} when the
# version does not match.
_REWIND_FUNCTION = """
local function rewind(key, a)
  local expected, to = ARGV[a], tonumber(ARGV[a + 1])
  local tail = redis.call('LINDEX', key, -1)
  local v = version_of(tail)
  if expected ~= '*' and tonumber(expected) ~= v then return {-1, v} end
  if not tail then return {0, 0, 0, 0, 0} end
  local ttl = ttl_of(key)
  local life = life_of(tail)
  if life == '' then life = ARGV[a + 2] end
  local removed, delta = 0, 0
  while tail and tonumber(string.match(tail, '^{"id":"[^"]*","v":(%d+)')) > to do
    redis.call('RPOP', key)
    sizes_pop(key)
    removed = removed + 1
    delta = delta - #tail
    tail = redis.call('LINDEX', key, -1)
  end
  if removed == 0 then return {v, 0, redis.call('LLEN', key), 0, 0} end
  if not tail then return {0, removed, 0, delta, 0}, 'forget', 0, 0 end
  delta = delta + mark_rewound(key, v + 1, life)
  local length = redis.call('LLEN', key)
  return {v + 1, removed, length, delta, ttl}, 'add', delta, ttl, length
end
"""

# create(key, a): ARGV from ``a`` on holds cap, ttl, the new conversation's life id, then whole stored entries
# (a fork's copies). Refused ({-1}) when the key exists; answers {version, entries kept}.
_CREATE_FUNCTION = """
local function create(key, a)
  local cap, ttl, first = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), a + 3
  if redis.call('EXISTS', key) == 1 then return {-1, 0} end
  if #ARGV < first then return {0, 0} end
  if RETRY then redis.call('DEL', RETRY) end
  redis.call('RPUSH', key, unpack(ARGV, first, #ARGV))
  redis.call('LTRIM', key, -cap, -1)
  local kept = {unpack(ARGV, math.max(first, #ARGV - cap + 1), #ARGV)}
  sizes_push(key, true, kept, cap, ttl)
  local size = restamp(key, nil, ARGV[a + 2])
  redis.call('EXPIRE', key, ttl)
  for _, e in ipairs(kept) do size = size + #e end
  return {version_of(kept[#kept]), #kept}, 'set', size, ttl, #kept
end
"""

# Per-space storage accounting on two keys, one hash tag (one Cluster slot): expiries, a sorted set of
# conversation key -> expiry in ms, and sizes, a hash of conversation key -> bytes plus the space's total
# under 'total'. Conversations past their expiry are dropped first (a bounded number per call), so TTL
# expiry frees quota without any sweeper; the two keys expire with the last conversation they count.
# - usage_reserve admits a write: verdict 2 when the space's bytes are at the limit, 1 when the
#   conversation is not counted yet and the count is at the limit; otherwise a new conversation is counted
#   at once (provisionally for 60 s, until its write sets its real expiry; a write that fails leaves it
#   counted that long), so concurrent writers cannot all pass a check made before any of them is counted;
# - usage_admit prunes, then reserves (or refuses and settles), answering the time and the verdict;
# - usage_apply accounts a write ('add' bytes, 'set' the conversation's size) or a delete ('forget');
# - usage_settle expires the keys with their last conversation and answers {conversations, bytes}.
# The catalogue (``sessionmem_core.keys.usage_keys_of``: metadata, summaries and the conversation's newest-first index,
# in the same slot) is kept in the same step: ``CATALOGUE`` names its keys, and the accounting of a write
# updates the conversation's record and index entry (``catalogue_touch``, with the entries it holds) or
# drops them with it (``catalogue_forget``: a delete, an erasure, an expiry found by the prune). Its
# fields per conversation key K: 'c:K' created, 'n:K' entries, 'r:K' the index it is listed in, 'ti:K'
# title and 'la:K' labels (JSON); the index's score is the last write's time.
_USAGE_FUNCTIONS = """
local CATALOGUE = nil
local function catalogue_forget(field)
  if not CATALOGUE then return end
  local listed = redis.call('HGET', CATALOGUE.meta, 'r:' .. field)
  if listed then redis.call('ZREM', listed, field) end
  redis.call('HDEL', CATALOGUE.meta, 'c:' .. field, 'n:' .. field, 'r:' .. field, 'ti:' .. field, 'la:' .. field)
  redis.call('HDEL', CATALOGUE.summary, field)
end
local function catalogue_touch(field, now, length, ttl)
  if not CATALOGUE then return end
  if length == 0 then return catalogue_forget(field) end
  redis.call('HSETNX', CATALOGUE.meta, 'c:' .. field, now)
  redis.call('HSET', CATALOGUE.meta, 'n:' .. field, length, 'r:' .. field, CATALOGUE.recent)
  redis.call('ZADD', CATALOGUE.recent, now, field)
  local keep = ttl * 1000 + 1000
  if redis.call('PTTL', CATALOGUE.recent) < keep then redis.call('PEXPIRE', CATALOGUE.recent, keep) end
end
local function usage_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function usage_prune(expiries, sizes, now)
  local gone = redis.call('ZRANGEBYSCORE', expiries, '-inf', now, 'LIMIT', 0, 64)
  for _, f in ipairs(gone) do
    redis.call('HINCRBY', sizes, 'total', -tonumber(redis.call('HGET', sizes, f) or '0'))
    redis.call('HDEL', sizes, f)
    redis.call('ZREM', expiries, f)
    catalogue_forget(f)
  end
end
local function usage_reserve(expiries, sizes, field, now, max_conversations, max_bytes)
  if tonumber(redis.call('HGET', sizes, 'total') or '0') >= max_bytes then return 2 end
  if not redis.call('ZSCORE', expiries, field) then
    if redis.call('ZCARD', expiries) >= max_conversations then return 1 end
    redis.call('ZADD', expiries, now + 60000, field)
  end
  return 0
end
local function usage_apply(expiries, sizes, field, op, amount, ttl, now, length)
  local old = tonumber(redis.call('HGET', sizes, field) or '0')
  if op == 'forget' then
    redis.call('HDEL', sizes, field)
    redis.call('HINCRBY', sizes, 'total', -old)
    redis.call('ZREM', expiries, field)
    catalogue_forget(field)
    return
  end
  if length then catalogue_touch(field, now, length, ttl) end
  local new = amount
  if op == 'add' then new = old + amount end
  if op == 'set' and CATALOGUE then redis.call('HDEL', CATALOGUE.summary, field) end
  if new < 0 then new = 0 end
  redis.call('HSET', sizes, field, new)
  redis.call('HINCRBY', sizes, 'total', new - old)
  redis.call('ZADD', expiries, now + ttl * 1000, field)
end
local function usage_settle(expiries, sizes)
  local count = redis.call('ZCARD', expiries)
  if count == 0 then
    redis.call('DEL', expiries, sizes)
    if CATALOGUE then redis.call('DEL', CATALOGUE.meta, CATALOGUE.summary) end
    return {0, 0}
  end
  local last = redis.call('ZRANGE', expiries, -1, -1, 'WITHSCORES')
  local at = math.floor(tonumber(last[2])) + 1000
  redis.call('PEXPIREAT', expiries, at)
  redis.call('PEXPIREAT', sizes, at)
  if CATALOGUE then
    redis.call('PEXPIREAT', CATALOGUE.meta, at)
    redis.call('PEXPIREAT', CATALOGUE.summary, at)
  end
  return {count, tonumber(redis.call('HGET', sizes, 'total') or '0')}
end
local function usage_admit(expiries, sizes, field, max_conversations, max_bytes)
  local now = usage_now()
  usage_prune(expiries, sizes, now)
  local verdict = usage_reserve(expiries, sizes, field, now, max_conversations, max_bytes)
  if verdict ~= 0 then usage_settle(expiries, sizes) end
  return now, verdict
end
"""

# Encryption at rest: which data key (DEK) each unit of a space writes with now, in the space's accounting
# slot (``sessionmem_core.keys.data_key_marks``): a hash of unit -> '<generation>:<DEK id>' ('<generation>:'
# when the unit has none confirmed), '*' -> the generation of the space's last whole erasure (it retires
# every unit's mark) and '^' -> the greatest generation ever given. A write that seals names the unit and
# the DEK id it sealed with, and is refused in its own step when they differ from the mark
# (``data_key_stale``: the mark's generation, so the writer can confirm the current DEK against it).
# - data_key_confirm (the writer, after asking the DEK store for the unit's DEK afresh) sets the mark to
#   that DEK only while the mark is still at the generation the refusal answered: an erasure in between
#   moved it on, and the writer asks again;
# - data_key_retire (an erasure, before and after destroying the DEK) moves the mark to a new generation
#   with no DEK, so no write sealed with the destroyed one is stored from then on.
# Generations are the server's time in ms and never go back ('^'), so a mark that expired and was made
# again is not mistaken for one a writer saw before.
_DATA_KEY_FUNCTIONS = """
local function data_key_mark(marks, unit)
  local got = redis.call('HMGET', marks, '*', unit)
  local space, generation, dek = tonumber(got[1]) or 0, 0, ''
  if got[2] then
    local g, d = string.match(got[2], '^(%d+):(.*)$')
    generation, dek = tonumber(g), d
  end
  if space > generation then return space, '' end
  return generation, dek
end
local function data_key_stale(marks, unit, dek)
  local generation, current = data_key_mark(marks, unit)
  if current ~= '' and current == dek then return nil end
  return generation
end
local function data_key_keep(marks, seconds)
  if redis.call('PTTL', marks) < seconds * 1000 then redis.call('EXPIRE', marks, seconds) end
end
"""

# data_key_confirm: KEYS = the marks; ARGV = unit, the generation the refusal answered, the DEK id, how long
# the marks are kept (s). Answers {1, generation} when set, {0, the current generation} otherwise.
_DATA_KEY_CONFIRM = (
    _DATA_KEY_FUNCTIONS
    + """
local generation = data_key_mark(KEYS[1], ARGV[1])
if generation ~= tonumber(ARGV[2]) then return {0, generation} end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', generation) .. ':' .. ARGV[3])
data_key_keep(KEYS[1], tonumber(ARGV[4]))
return {1, generation}
"""
)

# data_key_retire: KEYS = the marks; ARGV = the unit ('' for every unit of the space), how long the marks
# are kept (s). Answers the new generation.
_DATA_KEY_RETIRE = (
    _DATA_KEY_FUNCTIONS
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local generation = math.max(now, (tonumber(redis.call('HGET', KEYS[1], '^')) or 0) + 1)
local mark = string.format('%d', generation)
if ARGV[1] == '' then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], '*', mark, '^', mark)
else
  redis.call('HSET', KEYS[1], ARGV[1], mark .. ':', '^', mark)
end
data_key_keep(KEYS[1], tonumber(ARGV[2]))
return generation
"""
)

# data_key_check (a Cluster, where the conversation and the marks are two slots and cannot share a
# script): KEYS = the marks; ARGV = unit, DEK id. Answers -1 when the DEK is current, else the generation.
_DATA_KEY_CHECK = (
    "#!lua flags=no-writes\n"
    + _DATA_KEY_FUNCTIONS
    + """
return data_key_stale(KEYS[1], ARGV[1], ARGV[2]) or -1
"""
)

# counted(write): a write behind its quota check and with its accounting, one atomic step. KEYS = the
# conversation, expiries, sizes, then the catalogue's metadata, summaries and index, the entry sizes and
# the retry index kept beside the conversation (``SIZES``, ``RETRY``), and for a write that seals the
# space's data key marks; ARGV = max conversations, max bytes, for a write that seals its unit and DEK
# id, then the write's own arguments.
# Answers {0, the write's reply}, or {verdict} when refused (1 or 2: nothing written), or {3, the mark's
# generation} when the DEK is not the unit's current one.
_COUNTED_FUNCTION = """
local function counted(write)
  CATALOGUE = {meta = KEYS[4], summary = KEYS[5], recent = KEYS[6]}
  local a = 3
  if KEYS[9] then
    local stale = data_key_stale(KEYS[9], ARGV[3], ARGV[4])
    if stale then return {3, stale} end
    a = 5
  end
  local now, verdict = usage_admit(KEYS[2], KEYS[3], KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]))
  if verdict ~= 0 then return {verdict} end
  local reply, op, bytes, ttl, length = write(KEYS[1], a)
  if op then usage_apply(KEYS[2], KEYS[3], KEYS[1], op, bytes, ttl, now, length) end
  usage_settle(KEYS[2], KEYS[3])
  return {0, reply}
end
"""


# shrinking(write): a write that only removes (a pop, a rewind), with its accounting and no quota check
# (what frees storage is never refused for want of it). KEYS and ARGV as ``counted``'s.
_SHRINKING_FUNCTION = """
local function shrinking(write)
  CATALOGUE = {meta = KEYS[4], summary = KEYS[5], recent = KEYS[6]}
  local now = usage_now()
  usage_prune(KEYS[2], KEYS[3], now)
  local reply, op, bytes, ttl, length = write(KEYS[1], 3)
  if op then usage_apply(KEYS[2], KEYS[3], KEYS[1], op, bytes, ttl, now, length) end
  usage_settle(KEYS[2], KEYS[3])
  return {0, reply}
end
"""


def _scripts(function: str, name: str, admitted: bool = True) -> tuple[str, str]:
    """A write's two scripts: alone (KEYS = the conversation; its arguments from ARGV[1]), answering its
    reply; and counted (``counted`` above, or ``shrinking`` for a write that is not ``admitted``)."""
    body = _VERSION_FUNCTIONS + function
    alone = body + f"SIZES = KEYS[2]\nRETRY = KEYS[3]\nlocal reply = {name}(KEYS[1], 1)\nreturn reply\n"
    wrapper, wrap = (_COUNTED_FUNCTION, "counted") if admitted else (_SHRINKING_FUNCTION, "shrinking")
    counted = _USAGE_FUNCTIONS + _DATA_KEY_FUNCTIONS + wrapper + body
    return alone, counted + f"SIZES = KEYS[7]\nRETRY = KEYS[8]\nreturn {wrap}({name})\n"


_APPEND, _APPEND_COUNTED = _scripts(_APPEND_FUNCTION, "append")
_REPLACE, _REPLACE_COUNTED = _scripts(_REPLACE_FUNCTION, "replace")
_POP, _POP_COUNTED = _scripts(_POP_FUNCTION, "pop", admitted=False)
_REWIND, _REWIND_COUNTED = _scripts(_REWIND_FUNCTION, "rewind", admitted=False)
_CREATE, _CREATE_COUNTED = _scripts(_CREATE_FUNCTION, "create")

# The accounting alone (a Cluster, where it cannot share a script with the conversation): KEYS =
# expiries, sizes, the catalogue's three; ARGV = op ('reserve' max-conversations max-bytes | 'add' bytes
# ttl | 'set' bytes ttl | 'forget' | 'peek'), the conversation key, two numbers, the entries it holds
# ('' when not known: the catalogue keeps its record). Answers {conversations, bytes, 1 when the
# conversation was counted already, verdict}.
_USAGE = (
    _USAGE_FUNCTIONS
    + """
CATALOGUE = {meta = KEYS[3], summary = KEYS[4], recent = KEYS[5]}
local now = usage_now()
usage_prune(KEYS[1], KEYS[2], now)
local op, field = ARGV[1], ARGV[2]
local known = redis.call('ZSCORE', KEYS[1], field) and 1 or 0
local verdict = 0
if op == 'reserve' then
  verdict = usage_reserve(KEYS[1], KEYS[2], field, now, tonumber(ARGV[3]), tonumber(ARGV[4]))
elseif op ~= 'peek' then
  usage_apply(KEYS[1], KEYS[2], field, op, tonumber(ARGV[3]), tonumber(ARGV[4]), now, tonumber(ARGV[5]))
end
local totals = usage_settle(KEYS[1], KEYS[2])
return {totals[1], totals[2], known, verdict}
"""
)

# Delete: ARGV[1] the expected version ('*' for any). Answers {entries removed, version}, or {-1, the
# current version} when it does not match (nothing removed).
_DELETE = (
    _VERSION_FUNCTIONS
    + """
local v = version_of(redis.call('LINDEX', KEYS[1], -1))
if ARGV[1] ~= '*' and tonumber(ARGV[1]) ~= v then return {-1, v} end
local n = redis.call('LLEN', KEYS[1])
redis.call('DEL', KEYS[1])
if KEYS[2] then redis.call('DEL', KEYS[2], KEYS[3]) end
return {n, v}
"""
)

# Delete with its accounting: KEYS = the conversation, expiries, sizes, the catalogue's three.
_DELETE_COUNTED = (
    _USAGE_FUNCTIONS
    + _VERSION_FUNCTIONS
    + """
CATALOGUE = {meta = KEYS[4], summary = KEYS[5], recent = KEYS[6]}
local v = version_of(redis.call('LINDEX', KEYS[1], -1))
if ARGV[1] ~= '*' and tonumber(ARGV[1]) ~= v then return {-1, v} end
local n = redis.call('LLEN', KEYS[1])
redis.call('DEL', KEYS[1])
if KEYS[7] then redis.call('DEL', KEYS[7], KEYS[8]) end
local now = usage_now()
usage_prune(KEYS[2], KEYS[3], now)
usage_apply(KEYS[2], KEYS[3], KEYS[1], 'forget', 0, 0, now)
usage_settle(KEYS[2], KEYS[3])
return {n, v}
"""
)

# Info: length, newest entry (for the version), remaining TTL in ms.
_INFO = """#!lua flags=no-writes
return {redis.call('LLEN', KEYS[1]), redis.call('LINDEX', KEYS[1], -1) or '', redis.call('PTTL', KEYS[1])}
"""

# A read's answer is bounded by bytes as well as by entries: the newest entries (at most ARGV[1]) that fit in
# READ_ANSWER_BYTES (ARGV[2]), and always the newest one. So an agent whose entries are large (up to about
# 1.5 MiB each, MAX_CONTENT_CHARS escaped) makes Valkey build, and the proxy hold, at most this much per
# read, not limit x entry size (500 x 1 MiB took a worker from 92 MiB to ~830 MiB).
#
# The window's bounds come from the entry sizes the writes keep beside the list (``sizes_key_of``: the
# last KEYS, with ARGV[6] the most bytes this script copies itself), so finding them copies no entry. A
# window of at most ARGV[6] bytes is answered here; a larger one is answered only its length, {'', {}, 0,
# length}, and read by a plain LRANGE (``ConversationStore._read_big``): a script copying megabytes holds
# Valkey's one thread many times longer than the LRANGE of the same bytes. Where the sizes do not cover
# the window (a list written before they were kept, or by hand; ARGV[6] '' on a Cluster), or do not match
# the entries, the entries are read here from the tail in chunks sized from the largest entry so far,
# starting at READ_FIRST_CHUNK (ARGV[4]) entries. With ARGV[3] (the summary id prefix), also the oldest
# entry when it is a rolling summary outside the window: {head or '', window, 0, -1}. With ARGV[5] (the
# conversation key) and KEYS[2] (the catalogue's summaries: standalone only), the conversation's
# compaction summary instead when it has one: {summary, window, 1, -1}.
READ_ANSWER_BYTES = 4 * 1024 * 1024
READ_FIRST_CHUNK = 8
# The most bytes of entries a read's or an export page's script copies itself (ARGV[6]): about what the
# LRANGE of a whole READ_ANSWER_BYTES window holds Valkey (a script's copy costs much more per byte, and
# more again past it). A larger window or page is read by LRANGE in a WATCHed transaction, tried at most
# READ_ATTEMPTS times while writes to the conversation overtake it (then a typed 503, ConversationBusy:
# never a mixed answer).
READ_COPY_BYTES = 256 * 1024
READ_ATTEMPTS = 5
_READ_WINDOW = """#!lua flags=no-writes
local key, budget = KEYS[1], tonumber(ARGV[2])
local sizes = ARGV[6] ~= '' and KEYS[#KEYS] or nil
local n = redis.call('LLEN', key)
local want = math.min(tonumber(ARGV[1]), n)
local function planned()
  if want == 0 then return 0, 0, {} end
  local known = redis.call('LRANGE', sizes, -want, -1)
  local used, taken, newest = 0, 0, {}
  for j = #known, 1, -1 do
    local size = tonumber(known[j])
    if taken > 0 and used + size > budget then return taken, used, newest end
    used, taken = used + size, taken + 1
    newest[taken] = size
  end
  if taken == want then return taken, used, newest end
  return nil
end
local function copied()
  local chunk = math.min(tonumber(ARGV[4]), want)
  local newest, used, taken, largest, last = {}, 0, 0, 1, want
  while taken < last do
    local part = redis.call('LRANGE', key, -(taken + chunk), -(taken + 1))
    for j = #part, 1, -1 do
      if taken == last then break end
      local size = #part[j]
      if taken > 0 and used + size > budget then last = taken break end
      used, taken = used + size, taken + 1
      newest[taken] = part[j]
      if size > largest then largest = size end
    end
    if #part == 0 then break end
    chunk = math.max(1, math.min(last - taken, math.floor((budget - used) / largest)))
  end
  local window = {}
  for i = taken, 1, -1 do window[#window + 1] = newest[i] end
  return window, taken
end
local window, taken = nil, 0
if sizes then
  local k, used, known = planned()
  if k and used > tonumber(ARGV[6]) then return {'', {}, 0, k} end
  if k then
    window, taken = k > 0 and redis.call('LRANGE', key, -k, -1) or {}, k
    if #window ~= k then window = nil end
    for i = 1, k do
      if window and #window[i] ~= known[k + 1 - i] then window = nil end
    end
  end
end
if not window then window, taken = copied() end
if ARGV[5] ~= '' and KEYS[2] and KEYS[2] ~= sizes then
  local summary = redis.call('HGET', KEYS[2], ARGV[5])
  if summary then return {summary, window, 1, -1} end
end
local head = ''
if ARGV[3] ~= '' and n > taken then
  head = redis.call('LINDEX', key, 0) or ''
  local marker = '{"id":"' .. ARGV[3]
  if string.sub(head, 1, #marker) ~= marker then head = '' end
end
return {head, window, 0, -1}
"""

# A conversation's compaction summary: KEYS = the catalogue's summaries; ARGV = the conversation key.
_SUMMARY_OF = """#!lua flags=no-writes
return redis.call('HGET', KEYS[1], ARGV[1]) or ''
"""

# One page of an export in one step, so a page is one round trip and its entries, the list's length and
# version (and the summary) are of one moment: {length, newest entry or '', the page, the next page's
# offset or -1, the compaction summary or '', -1}, or {-2} alone (nothing read) for an unchanged one.
# From offset ARGV[1], entries until they pass ARGV[2] bytes, taken in steps sized from the largest entry so far, from
# ARGV[3] entries up to ARGV[4] (entries may be large, so the first step is small). With ARGV[5] (the conversation
# key) and KEYS[2] (the catalogue's summaries: standalone only), also its compaction summary. As a read's window, the
# page's bounds come from the sizes kept beside the list (the last KEYS, with ARGV[6] the most bytes this script
# copies itself): a larger page is answered {length, '', {}, next offset, '', its entries} and read by a plain LRANGE
# (``ConversationStore._export_big``); where the sizes do not cover it, it is read here. With ARGV[7..9] (the life,
# version and summary digest of an If-None-Match, ``sessionmem_core.api.etag``): {-2} when they are the conversation's
# (the digest: the first 16 hex digits of the stored summary's SHA-1, '' for none).
_EXPORT_PAGE = (
    "#!lua flags=no-writes\n"
    + _VERSION_FUNCTIONS
    + """
local key, at, budget = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local first_step, max_step = tonumber(ARGV[3]), tonumber(ARGV[4])
local sizes = ARGV[6] ~= '' and KEYS[#KEYS] or nil
if ARGV[7] then
  local newest = redis.call('LINDEX', key, -1)
  local held = ''
  if ARGV[5] ~= '' then held = redis.call('HGET', KEYS[2], ARGV[5]) or '' end
  local life, digest = '-', ''
  if newest then life = life_of(newest) end
  if held ~= '' then digest = string.sub(redis.sha1hex(held), 1, 16) end
  if life ~= '' and life == ARGV[7] and tostring(version_of(newest)) == ARGV[8] and digest == ARGV[9] then
    return {-2}
  end
end
local n = redis.call('LLEN', key)
local page = nil
if sizes and at < n then
  local m = redis.call('LLEN', sizes)
  local base = n - m
  if m <= n and at >= base then
    local known, taken, step = {}, 0, first_step
    while taken < budget and at + #known < n do
      local from = at - base + #known
      local got = redis.call('LRANGE', sizes, from, from + math.min(step, n - at - #known) - 1)
      if #got == 0 then break end
      local largest = 1
      for i = 1, #got do
        local size = tonumber(got[i])
        known[#known + 1] = size
        taken = taken + size
        if size > largest then largest = size end
      end
      step = math.max(1, math.min(max_step, math.floor((budget - taken) / largest)))
    end
    local after = at + #known
    if taken > tonumber(ARGV[6]) then return {n, '', {}, after < n and after or -1, '', #known} end
    page = redis.call('LRANGE', key, at, after - 1)
    if #page ~= #known then page = nil end
    for i = 1, #known do
      if page and #page[i] ~= known[i] then page = nil end
    end
    if page then at = after end
  end
end
if not page then
  local step = first_step
  page = {}
  local taken = 0
  while taken < budget and at < n do
    local got = redis.call('LRANGE', key, at, math.min(at + step, n) - 1)
    if #got == 0 then break end
    local largest = 1
    for i = 1, #got do
      local size = #got[i]
      page[#page + 1] = got[i]
      taken = taken + size
      if size > largest then largest = size end
    end
    at = at + #got
    step = math.max(1, math.min(max_step, math.floor((budget - taken) / largest)))
  end
end
local tail = n > 0 and redis.call('LINDEX', key, -1) or ''
local summary = ''
if ARGV[5] ~= '' and KEYS[2] and KEYS[2] ~= sizes then summary = redis.call('HGET', KEYS[2], ARGV[5]) or '' end
return {n, tail, page, at < n and at or -1, summary, -1}
"""
)

# Record a compaction summary, in the accounting's slot: KEYS = expiries, sizes, the catalogue's three,
# and for a sealed summary the data key marks; ARGV = the conversation key, the summary as stored, the
# conversation's TTL, max conversations, max bytes, and for a sealed summary its unit and DEK id. Its
# bytes count with the conversation's (a 'set' of its size, a replace or a new conversation, drops it:
# ``usage_apply``). Answers {verdict, 0} (0 recorded; 1, 2 refused: ``counted``'s), or {3, the mark's
# generation} when the DEK is not the unit's current one.
_COMPACT = (
    _USAGE_FUNCTIONS
    + _DATA_KEY_FUNCTIONS
    + """
CATALOGUE = {meta = KEYS[3], summary = KEYS[4], recent = KEYS[5]}
if KEYS[6] then
  local stale = data_key_stale(KEYS[6], ARGV[6], ARGV[7])
  if stale then return {3, stale} end
end
local field, raw, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now, verdict = usage_admit(KEYS[1], KEYS[2], field, tonumber(ARGV[4]), tonumber(ARGV[5]))
if verdict ~= 0 then return {verdict, 0} end
local old = redis.call('HSTRLEN', KEYS[4], field)
redis.call('HSET', KEYS[4], field, raw)
usage_apply(KEYS[1], KEYS[2], field, 'add', #raw - old, ttl, now, nil)
usage_settle(KEYS[1], KEYS[2])
return {0, 0}
"""
)

# A page of a catalogue index, newest write first: KEYS = the index, expiries, metadata; ARGV = the
# highest score to start from ('+inf', or a page's cursor score), how many members of that score the pages
# before took, the page size. Conversations past their expiry (not pruned yet) are skipped. Answers
# {records, 1 when there is more, cursor score, cursor count}; a record is {key, last write, created,
# entries, title, labels}. At most 2,000 members are examined per page (a page may end early).
_CATALOGUE_PAGE = """#!lua flags=no-writes
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max, skip, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out, more, examined = {}, 0, 0
local at_score, at_count = max, skip
local offset = skip
while more == 0 and examined < 2000 do
  local members = redis.call('ZREVRANGEBYSCORE', KEYS[1], max, '-inf', 'WITHSCORES', 'LIMIT', offset, 100)
  if #members == 0 then break end
  for i = 1, #members, 2 do
    local field, score = members[i], members[i + 1]
    local expiry = redis.call('ZSCORE', KEYS[2], field)
    local live = expiry and tonumber(expiry) > now
    if live and #out == limit then
      more = 1
      break
    end
    examined = examined + 1
    if score == at_score then at_count = at_count + 1 else at_score, at_count = score, 1 end
    if live then
      out[#out + 1] = {field, score, redis.call('HGET', KEYS[3], 'c:' .. field) or '',
        redis.call('HGET', KEYS[3], 'n:' .. field) or '', redis.call('HGET', KEYS[3], 'ti:' .. field) or '',
        redis.call('HGET', KEYS[3], 'la:' .. field) or ''}
    end
  end
  offset = offset + #members / 2
end
if examined >= 2000 then more = 1 end
return {out, more, at_score, at_count}
"""

# Set a conversation's title and labels: KEYS = metadata, and for sealed values the data key marks; ARGV =
# the conversation key, then for the title and the labels each '1' and its value (JSON text for the labels;
# '' clears), or '0' to keep it, and for sealed values their unit and DEK id. Answers {0} when the
# catalogue holds no such conversation, {-1, the mark's generation} when the DEK is not the unit's current
# one, else {1, created, entries, title, labels, index}.
_SET_METADATA = (
    _DATA_KEY_FUNCTIONS
    + """
if KEYS[2] then
  local stale = data_key_stale(KEYS[2], ARGV[6], ARGV[7])
  if stale then return {-1, stale} end
end
local field = ARGV[1]
if redis.call('HEXISTS', KEYS[1], 'n:' .. field) == 0 then return {0} end
local function set(name, flag, value)
  if flag ~= '1' then return end
  if value == '' then
    redis.call('HDEL', KEYS[1], name .. field)
  else
    redis.call('HSET', KEYS[1], name .. field, value)
  end
end
set('ti:', ARGV[2], ARGV[3])
set('la:', ARGV[4], ARGV[5])
local record = redis.call('HMGET', KEYS[1], 'c:' .. field, 'n:' .. field, 'ti:' .. field, 'la:' .. field, 'r:' .. field)
local index = record[5]
local updated = index and redis.call('ZSCORE', index, field) or ''
return {1, record[1] or '', record[2] or '', record[3] or '', record[4] or '', updated or ''}
"""
)


# The names a conversation's sealed catalogue fields are bound to (``sealing.Sealer.seal_field``).
_TITLE, _LABELS = "title", "labels"

_VERSION = re.compile(rb'^\{"id":"[^"]*","v":(\d+)(?:,"rewoundAt":(\d+))?')
_LIFE = re.compile(rb'^\{"id":"[^"]*","v":\d+(?:,"rewoundAt":\d+)?(?:,"idempotencyKey":"[^"]*")?,"life":"([^"]*)"')
# The life of a conversation that holds nothing (``sessionmem_core.api.etag``): all empty answers are alike.
NO_LIFE = "-"
_REWOUND_AT = re.compile(rb'^(\{"id":"[^"]*","v":\d+),"rewoundAt":\d+')


def version_of(raw_entry: bytes) -> int:
    """The conversation's version as its newest entry tells it (``version_of`` of the scripts)."""
    match = _VERSION.match(raw_entry)
    if match is None:
        return 0
    written, rewound = match.groups()
    return max(int(written), int(rewound)) if rewound else int(written)


def life_of(raw_newest: bytes | None) -> str | None:
    """The life id of a conversation as its newest entry tells it (``life_of`` of the scripts); ``NO_LIFE``
    when it holds nothing; None for a newest entry written before lives were stamped (its answers carry no
    ETag, so nothing can match one)."""
    if not raw_newest:
        return NO_LIFE
    match = _LIFE.match(raw_newest)
    return match.group(1).decode() if match else None


def summary_digest(stored: bytes) -> str:
    """What an export's ETag holds of its compaction summary: the first 16 hex digits of the SHA-1 of the
    summary as stored (what the export script computes with ``redis.sha1hex``)."""
    return hashlib.sha1(stored, usedforsecurity=False).hexdigest()[:16]


def written_at(raw_entry: bytes) -> int:
    """The version an entry was written at (its ``v``)."""
    match = _VERSION.match(raw_entry)
    return int(match.group(1)) if match else 0


def without_rewound_at(raw_entry: bytes) -> bytes:
    """The entry as written: without the ``rewoundAt`` a pop or rewind stamped on it."""
    return _REWOUND_AT.sub(rb"\1", raw_entry, count=1)


class EntryToStore(Protocol):
    """What the store writes of one entry: a request's entry as validated (``wire.EntryIn``), or a
    ``NewEntry`` the proxy made (a redacted copy)."""

    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...

    @property
    def id(self) -> str | None: ...

    @property
    def item(self) -> dict[str, Any] | None: ...


# The value objects built for every request are plain (not frozen) slotted dataclasses: building a frozen
# one costs about three times as much (its __init__ goes through object.__setattr__). Nothing mutates them.


@dataclass(slots=True)
class NewEntry:
    role: str
    content: str
    id: str | None = None
    item: dict[str, Any] | None = None


@dataclass(slots=True)
class AppendResult:
    version: int
    stored: int
    length: int = 0
    # Ids of the batch's entries that were not stored: already in the conversation, or repeated in the batch.
    duplicate_ids: tuple[str, ...] = ()
    # Bytes the conversation grew by (negative when the cap trimmed more than was added).
    bytes_added: int = 0
    created: bool = False
    # The conversation's life id after the write (``life_of``), and with ``represent``, the stored entries as
    # a read answers them (None when not every entry of the batch was stored).
    life: str | None = None
    raw_entries: list[bytes] | None = None

    @property
    def duplicate(self) -> bool:
        """Nothing new was stored: the whole batch was a retry."""
        return self.stored == 0


@dataclass(slots=True)
class PopResult:
    version: int
    length: int
    # The entry removed, as it was stored; None when there was none.
    raw_entry: bytes | None


@dataclass(slots=True)
class RewindResult:
    version: int
    removed: int
    length: int


@dataclass(slots=True)
class ReadResult:
    version: int
    raw_entries: list[bytes]
    raw_summary: bytes | None = None
    life: str | None = NO_LIFE


@dataclass(slots=True)
class ExportPage:
    """One page of an export (``ConversationStore.export_page``), read in one step."""

    length: int
    version: int
    raw_entries: list[bytes]
    next_offset: int | None
    raw_summary: bytes | None = None
    life: str | None = NO_LIFE
    # The digest of the summary as stored (``summary_digest``), None without one.
    summary_digest: str | None = None
    # The page was not read: the conversation is in the state its If-None-Match named.
    unchanged: bool = False


@dataclass(slots=True)
class CatalogueRecord:
    """A conversation as its space's catalogue holds it."""

    key: str
    updated: int | None
    created: int | None
    entries: int | None
    title: str | None
    labels: dict[str, str]


@dataclass(slots=True)
class CataloguePage:
    records: list[CatalogueRecord]
    # Where the next page starts (the last score and how many members of it were taken), None when done.
    cursor: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class Usage:
    """What one space (an agent's private conversations, or a registry's shared ones) holds."""

    conversations: int
    bytes: int
    # Whether the conversation the call named was counted already.
    counted: bool = False
    # For a reservation: 0 admitted, 1 refused (conversation count at its limit), 2 refused (bytes).
    verdict: int = 0


class StorageQuota(Protocol):
    """The storage quota a write is admitted against: the writing agent's limits (``quotas.QuotaLimits``),
    handed to the write by the operation that was admitted with them."""

    @property
    def max_conversations(self) -> int: ...

    @property
    def max_bytes(self) -> int: ...


class UsageLedger:
    """Per-space storage accounting, kept next to the conversations (``sessionmem_core.keys.usage_keys_of``).

    On a standalone Valkey (``atomic``) the store runs each write and its accounting as one script, so the
    quota check, the write and the accounting are one atomic step and cost one call. On a Cluster the
    conversation and its accounting are two slots and cannot share a script: a write is admitted by one
    call (``reserve``) and accounted by another after it (``added``/``sized``/``forget``); a proxy that dies
    between the two leaves the accounting short by that write (erring toward the tenant) until the
    conversation's next write sets its size right again. Either way the work is O(1) in the conversation's
    length and O(log n) in the space's conversations."""

    def __init__(self, client: ValkeyLike) -> None:
        self._script = client.register_script(_USAGE)
        self.atomic = not isinstance(client, ValkeyCluster)

    async def reserve(self, conversation_key: str, max_conversations: int, max_bytes: int) -> Usage:
        return await self._run("reserve", conversation_key, max_conversations, max_bytes)

    async def peek(self, conversation_key: str) -> Usage:
        return await self._run("peek", conversation_key, 0, 0)

    async def added(self, conversation_key: str, size: int, ttl_seconds: int, length: int | None = None) -> Usage:
        """``length``: the entries the conversation holds now, for its catalogue record (None: unknown)."""
        return await self._run("add", conversation_key, size, ttl_seconds, length)

    async def sized(self, conversation_key: str, size: int, ttl_seconds: int, length: int | None = None) -> Usage:
        return await self._run("set", conversation_key, size, ttl_seconds, length)

    async def forget(self, conversation_key: str) -> Usage:
        return await self._run("forget", conversation_key, 0, 0)

    async def _run(self, op: str, conversation_key: str, first: int, second: int, length: int | None = None) -> Usage:
        keys = list(usage_keys_of(conversation_key))
        args = [op, conversation_key, first, second, "" if length is None else length]
        conversations, total, counted, verdict = await ConversationStore._guard(self._script(keys=keys, args=args))
        return Usage(int(conversations), int(total), bool(counted), int(verdict))


def refusal(verdict: int, max_conversations: int, max_bytes: int) -> QuotaExceeded:
    """The typed answer to a write the accounting refused (verdict 1: conversations, 2: bytes)."""
    if verdict == 2:
        return QuotaExceeded(f"stored bytes are at the quota of {max_bytes}")
    return QuotaExceeded(f"stored conversations are at the quota of {max_conversations}")


class ValkeyLike(Protocol):
    """What the store needs of a client: satisfied by valkey-py's standalone and cluster clients."""

    def register_script(self, script: str) -> Any: ...

    def lrange(self, name: str, start: int, end: int) -> Any: ...

    def ping(self) -> Any: ...

    def scan(self, cursor: int = 0, match: str | None = None, count: int | None = None) -> Any: ...


def _entry_args(
    entries: Sequence[EntryToStore],
    author: str,
    now_ms: int,
    client_flags: bool = False,
    ids_identify: bool = True,
    seal: Seal | None = None,
    plain: list[tuple[str, bytes]] | None = None,
) -> list[str | bytes]:
    """(id, rest-of-entry) pairs; with ``client_flags``, (id, '1' if the client chose it and ids identify
    retries (``ids_identify``) else '0', rest). ``plain``: gets each (id, rest) unsealed.
    An item is serialized after the proxy's fields, its keys in the order given; an item over
    ``MAX_ITEM_BYTES`` stored is a typed 413, one JSON cannot hold (an integer past 64 bits) a 400. (The
    content is bounded in characters by the request model, as before items.)"""
    args: list[str | bytes] = []
    for entry in entries:
        rest = orjson.dumps({"role": entry.role, "content": entry.content, "author": author, "ts": now_ms})
        if entry.item is not None:
            rest = rest[:-1] + b',"item":' + _item_json(entry.item) + b"}"
        # The id was validated (no quotes, no control characters), so it is safe inside a JSON string.
        entry_id = entry.id or new_message_id()
        args.append(entry_id)
        if client_flags:
            args.append("1" if entry.id and ids_identify else "0")
        args.append(b"," + rest[1:] if seal is None else seal(entry_id, rest))
        if plain is not None:
            plain.append((entry_id, rest))
    return args


def _as_stored(plain: list[tuple[str, bytes]], version: int, idempotency_key: str | None, life: str) -> list[bytes]:
    """The entries of one append as a read answers them (opened): what the append script writes in front of
    each entry's fields (its id, version, the key on the first and the life id on the last), then the
    fields. Only for a batch stored whole."""
    stored: list[bytes] = []
    last = len(plain) - 1
    for index, (entry_id, rest) in enumerate(plain):
        head = b'{"id":"%s","v":%d' % (entry_id.encode(), version)
        if index == 0 and idempotency_key:
            head += b',"idempotencyKey":"%s"' % idempotency_key.encode()
        if index == last:
            head += b',"life":"%s"' % life.encode()
        stored.append(head + b"," + rest[1:])
    return stored


def _item_json(item: dict[str, Any]) -> bytes:
    try:
        stored = orjson.dumps(item)
    except orjson.JSONEncodeError as exc:
        raise InvalidRequest(f"body.entries.item: not storable as JSON: {exc}") from exc
    if len(stored) > env.MAX_ITEM_BYTES:
        raise PayloadTooLarge(f"an item would store {len(stored)} bytes; at most {env.MAX_ITEM_BYTES}")
    return stored


def append_args(
    entries: Sequence[EntryToStore],
    author: str,
    cap: int,
    ttl_seconds: int,
    idempotency_key: str | None = None,
    seal: Seal | None = None,
    expected_version: int | None = None,
    plain: list[tuple[str, bytes]] | None = None,
) -> list[Any]:
    """ARGV of the append script (``APPEND_SCRIPT``) for one batch: what every append sends, and what
    the benchmark's Valkey ceiling sends to measure the same server-side step without the proxy. With
    ``idempotency_key`` (validated: it is written into stored JSON as it is) the key alone identifies a
    retry, and ids are not de-duplicated; with ``expected_version`` the append is conditional on it; ``plain``
    collects the entries as stored, to answer them (``represent``)."""
    return [
        cap,
        ttl_seconds,
        RETRY_WINDOW_ENTRIES,
        RETRY_WINDOW_BYTES,
        RETRY_CHUNK_ENTRIES,
        idempotency_key or "",
        "*" if expected_version is None else expected_version,
        new_message_id(),
        *_entry_args(entries, author, _now_ms(), True, idempotency_key is None, seal, plain),
    ]


def retry_index_member(idempotency_key: str) -> str:
    """What a conversation's retry index holds for an idempotency key (the append script's
    ``retry_member`` makes it alike: ``redis.sha1hex``'s first 8 characters): fixed in size whatever the
    key, so the index stays a small fraction of the entries it stands for (one member per keyed append it
    still holds, at most the cap), and not the key itself. Two keys sharing a digest cost only a search of
    the entries, never a retry taken for new."""
    return hashlib.sha1(idempotency_key.encode(), usedforsecurity=False).hexdigest()[:8]


# The append script, uncounted (the ledger's accounting apart), as ``append_args`` feeds it.
APPEND_SCRIPT = _APPEND


class ConversationStore:
    """Atomic operations on one conversation key; backend failures surface as BackendUnavailable."""

    def __init__(self, client: ValkeyLike, ledger: UsageLedger | None = None, sealer: Sealer | None = None) -> None:
        self._client = client
        self.ledger = ledger
        # Encryption at rest (``sealing``): with a sealer, every entry is sealed on its way in and opened on
        # its way out, so what the store answers is the same either way.
        self.sealer = sealer
        # With a ledger on a standalone Valkey every write runs its counted script, otherwise its plain one.
        self._counted = ledger is not None and ledger.atomic
        # On a standalone server every write also keeps the conversation's entry sizes (``sizes_key_of``),
        # from which a read finds its window's bounds; a Cluster would put them in another slot.
        self._sizes = not isinstance(client, ValkeyCluster)
        counted = self._counted
        self._append = client.register_script(_APPEND_COUNTED if counted else _APPEND)
        self._replace = client.register_script(_REPLACE_COUNTED if counted else _REPLACE)
        self._delete = client.register_script(_DELETE_COUNTED if counted else _DELETE)
        self._pop = client.register_script(_POP_COUNTED if counted else _POP)
        self._rewind = client.register_script(_REWIND_COUNTED if counted else _REWIND)
        self._create = client.register_script(_CREATE_COUNTED if counted else _CREATE)
        self._info = client.register_script(_INFO)
        self._catalogue_page = client.register_script(_CATALOGUE_PAGE)
        self._summary_of = client.register_script(_SUMMARY_OF)
        self._compact = client.register_script(_COMPACT)
        self._set_metadata = client.register_script(_SET_METADATA)
        self._read_window = client.register_script(_READ_WINDOW)
        self._export_page = client.register_script(_EXPORT_PAGE)
        self._data_key_confirm = client.register_script(_DATA_KEY_CONFIRM)
        self._data_key_retire = client.register_script(_DATA_KEY_RETIRE)
        self._data_key_check = client.register_script(_DATA_KEY_CHECK)

    async def append(
        self,
        key: str,
        entries: Sequence[EntryToStore],
        author: str,
        cap: int,
        ttl_seconds: int,
        quota: StorageQuota | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
        represent: bool = False,
    ) -> AppendResult:
        """``quota``: the writer's storage limits, which a store that accounts its writes needs (``_write``);
        ``idempotency_key``: the append's, which then alone identifies a retry; ``expected_version``: the
        version the append is conditional on (VersionConflict, nothing stored, when it is not the
        conversation's; a retry of an append stored already is answered as a retry first); ``represent``:
        also answer the stored entries (``AppendResult.raw_entries``)."""
        plain: list[tuple[str, bytes]] | None = [] if represent else None
        if self.sealer is None:
            # Without sealing, no coroutine more on the hot path.
            args = append_args(entries, author, cap, ttl_seconds, idempotency_key, None, expected_version, plain)
            reply = await self._write(self._append, key, args, quota)
        else:

            def sealed(dek: DataKey) -> Awaitable[Any]:
                if plain is not None:
                    plain.clear()  # sealed again after a refusal
                entry_seal = Sealer.sealing(dek, key)
                args = append_args(
                    entries, author, cap, ttl_seconds, idempotency_key, entry_seal, expected_version, plain
                )
                return self._write(self._append, key, args, quota, dek)

            reply = await self._sealed(key, sealed)
        version, stored, length, duplicates, added, created, life = reply
        if int(version) < 0:
            raise VersionConflict(f"conversation is at version {stored}, not {expected_version}")
        if self.ledger is not None and not self._counted and int(stored):
            size, ledger = int(added), self.ledger
            await self._account(
                ledger.sized(key, size, ttl_seconds, int(length))
                if created
                else ledger.added(key, size, ttl_seconds, int(length))
            )
        return AppendResult(
            version=int(version),
            stored=int(stored),
            length=int(length),
            duplicate_ids=_texts(duplicates) if duplicates else (),
            bytes_added=int(added),
            created=bool(created),
            life=_text(life),
            raw_entries=(
                _as_stored(plain, int(version), idempotency_key, _text(life))
                if plain and int(stored) == len(plain)
                else None
            ),
        )

    async def read(self, key: str, limit: int, big: BigRead | None = None) -> ReadResult:
        """The newest ``limit`` entries that fit in ``READ_ANSWER_BYTES`` (always the newest one); ``big``
        admits a window read apart from the script (``_read_big``), if given."""
        if limit <= 0:
            raw: list[bytes] = await self._guard(self._client.lrange(key, -1, -1))
            newest = raw[0] if raw else None
            return ReadResult(version=version_of(newest) if newest else 0, raw_entries=[], life=life_of(newest))
        _head, raw, _ = await self._window(key, limit, "", None, big)
        newest = raw[-1] if raw else None
        version = version_of(newest) if newest else 0
        if self.sealer is not None:
            raw = await self.sealer.open(key, raw)
        return ReadResult(version=version, raw_entries=raw, life=life_of(newest))

    async def read_with_summary(self, key: str, limit: int, big: BigRead | None = None) -> ReadResult:
        """``read`` (bounded by bytes as it is), and the conversation's summary: its compaction summary, with
        the window's entries after the version it covers; or else (none recorded) the rolling summary at the
        list's head when it is outside the window."""
        if limit <= 0:
            return await self.read(key, 0)
        summaries = usage_keys_of(key)[3] if self.ledger is not None else None
        if summaries is not None and self._counted:
            head, window, compacted = await self._window(key, limit, SUMMARY_ID_PREFIX, summaries, big)
        else:
            head = await self._guard(self._summary_of(keys=[summaries], args=[key])) if summaries else b""
            compacted = 1 if head else 0
            if head:
                _, window, _ = await self._window(key, limit, "", None, big)
            else:
                head, window, _ = await self._window(key, limit, SUMMARY_ID_PREFIX, None, big)
        version = version_of(window[-1]) if window else 0
        if int(compacted):
            through = written_at(head)
            window = [raw for raw in window if written_at(raw) > through]
        if self.sealer is not None:
            opened = await self.sealer.open(key, window)
            summary = await self.sealer.open(key, [head]) if head else []
            return ReadResult(version=version, raw_entries=opened, raw_summary=summary[0] if summary else None)
        return ReadResult(version=version, raw_entries=list(window), raw_summary=head or None)

    async def _window(
        self, key: str, limit: int, prefix: str, summaries: str | None, big: BigRead | None = None
    ) -> tuple[bytes, list[bytes], int]:
        """(head or summary, the window, 1 when the head is the compaction summary) of ``_READ_WINDOW``: in
        its script when small, else by ``_read_big``, once ``big`` (if given) admits it."""
        keys = [key, summaries] if summaries else [key]
        args: list[Any] = [limit, READ_ANSWER_BYTES, prefix, READ_FIRST_CHUNK, key if summaries else "", ""]
        if self._sizes:
            keys.append(sizes_key_of(key))
            args[5] = READ_COPY_BYTES if isinstance(self._client, PipelinedValkey) else ""
        head, window, compacted, length = await self._guard(self._read_window(keys=keys, args=args))
        if int(length) < 0:
            return bytes(head), list(window), int(compacted)
        end = big() if big is not None else None
        try:
            read: tuple[bytes, list[bytes], int] = await self._guard(self._read_big(key, keys, args))
        finally:
            if end is not None:
                end()
        return read

    async def _read_big(self, key: str, keys: list[str], args: list[Any]) -> tuple[bytes, list[bytes], int]:
        """A window too large to copy in a script: its length planned under WATCH (``_READ_WINDOW`` with
        nothing copied), then the window, its sizes and what goes with it read by plain commands in one
        MULTI/EXEC, which a write to the conversation in between aborts (planned again). So the answer is
        of one moment, and within the byte bound the plan found, without Valkey copying it through Lua."""
        assert isinstance(self._client, PipelinedValkey)
        sizes, prefix, summaries = keys[-1], args[2], keys[1] if args[4] else None
        plan = ["EVALSHA_RO", self._read_window.sha, len(keys), *keys, *args[:5], 0]
        async with self._client.exclusive() as session:
            for _ in range(READ_ATTEMPTS):
                planned = await self._planned(session, key, plan)
                if planned is None:
                    continue
                head, window, compacted, length = planned
                if int(length) < 0:  # the sizes do not cover it (any more): read in the script
                    await session.run(("UNWATCH",))
                    return bytes(head), list(window), int(compacted)
                k = int(length)
                reads: list[tuple[Any, ...]] = [("LRANGE", key, -k, -1), ("LRANGE", sizes, -k, -1), ("LLEN", key)]
                if summaries:
                    reads.append(("HGET", summaries, key))
                if prefix:
                    reads.append(("LINDEX", key, 0))
                done = (await session.run(("MULTI",), *reads, ("EXEC",)))[-1]
                if done is None:
                    continue  # a write came between the plan and the read: plan again
                window, known, n = list(done[0]), done[1], int(done[2])
                if len(window) != k or any(len(raw) != int(size) for raw, size in zip(window, known, strict=False)):
                    return await self._window_copied(keys, args)  # sizes not of these entries: written by hand
                summary = done[3] if summaries else None
                if summary:
                    return bytes(summary), window, 1
                head = done[-1] if prefix and n > k else b""
                marker = b'{"id":"' + str(prefix).encode()
                return (bytes(head) if head and head.startswith(marker) else b""), window, 0
        raise ConversationBusy(f"the conversation changed during each of {READ_ATTEMPTS} reads of its window")

    async def _planned(self, session: Session, key: str, plan: list[Any]) -> Any:
        """The plan's reply with ``key`` watched from before it; None when the script had to be loaded."""
        try:
            return (await session.run(("WATCH", key), plan))[1]
        except NoScriptError:
            await session.run(("SCRIPT", "LOAD", _READ_WINDOW if plan[1] == self._read_window.sha else _EXPORT_PAGE))
            return None

    async def _window_copied(self, keys: list[str], args: list[Any]) -> tuple[bytes, list[bytes], int]:
        """``_READ_WINDOW`` reading the entries itself (the sizes ignored)."""
        head, window, compacted, _ = await self._guard(self._read_window(keys=keys, args=[*args[:5], ""]))
        return bytes(head), list(window), int(compacted)

    async def summary_of(self, key: str) -> bytes | None:
        """The conversation's compaction summary as stored, if one was recorded."""
        if self.ledger is None:
            return None
        raw = await self._guard(self._summary_of(keys=[usage_keys_of(key)[3]], args=[key]))
        opened = await self._open(key, [bytes(raw)]) if raw else []
        return opened[0] if opened else None

    async def compact(
        self, key: str, summary: EntryToStore, author: str, through_version: int, quota: StorageQuota
    ) -> int:
        """Record ``summary`` as covering the entries up to ``through_version`` (kept as they are); the
        conversation's version. NotFound for a conversation that holds nothing, a typed 400 for a version
        it has not reached."""
        if self.ledger is None:
            raise InvalidRequest("this store keeps no catalogue: compaction is not available")
        length, version, ttl = await self.info(key)
        if not length or ttl is None:
            raise NotFound("no such conversation")
        if through_version > version:
            raise InvalidRequest(f"body.throughVersion: the conversation is at version {version}")

        async def record(dek: DataKey | None) -> None:
            seal = None if dek is None else Sealer.sealing(dek, key)
            entry_id, rest = _entry_args([summary], author, _now_ms(), seal=seal)
            assert isinstance(entry_id, str) and isinstance(rest, bytes)
            raw = b'{"id":"%s","v":%d%s' % (entry_id.encode(), through_version, rest)
            keys = list(usage_keys_of(key))
            args: list[Any] = [key, raw, ttl, quota.max_conversations, quota.max_bytes]
            if dek is not None:
                keys.append(data_key_marks(dek.unit))
                args += [dek.unit, dek.dek_id]
            verdict, generation = await self._guard(self._compact(keys=keys, args=args))
            if int(verdict) == 3:
                raise _StaleDataKey(int(generation))
            if int(verdict):
                raise refusal(int(verdict), quota.max_conversations, quota.max_bytes)

        await (record(None) if self.sealer is None else self._sealed(key, record))
        return version

    async def info(self, key: str) -> tuple[int, int, int | None]:
        """(entries, version, ttl in seconds or None when the key does not exist)."""
        length, tail, pttl = await self._call(self._info, key, [])
        ttl = None if int(pttl) < 0 else max(1, (int(pttl) + 999) // 1000)
        return int(length), version_of(tail) if tail else 0, ttl

    async def catalogue_page(
        self, index: str, expiries: str, meta: str, cursor: tuple[int, int] | None, limit: int
    ) -> CataloguePage:
        """One page of a catalogue index (``sessionmem_core.keys.catalogue_keys``), newest write first, from ``cursor``
        (a page's, None for the newest)."""
        top, taken = ("+inf", 0) if cursor is None else (str(cursor[0]), cursor[1])
        rows, more, score, count = await self._guard(
            self._catalogue_page(keys=[index, expiries, meta], args=[top, taken, limit])
        )
        records = [await self._record(row) for row in rows]
        return CataloguePage(records, (int(float(score)), int(count)) if int(more) else None)

    async def set_metadata(
        self, key: str, title: tuple[bool, str | None], labels: tuple[bool, dict[str, str] | None]
    ) -> CatalogueRecord | None:
        """Set (True, value; None clears) or keep (False, _) a conversation's title and labels; None when
        the catalogue does not list it."""
        meta = usage_keys_of(key)[2]
        title_plain = title[1] or ""
        labels_plain = orjson.dumps(labels[1]).decode() if labels[1] else ""

        async def store(dek: DataKey | None) -> Any:
            keys, title_text, labels_text, sealed_by = [meta], title_plain, labels_plain, []
            if dek is not None:
                # A title and labels are the user's words as much as the entries are: sealed alike.
                if title_text:
                    title_text = Sealer.seal_field(dek, key, _TITLE, title_text)
                if labels_text:
                    labels_text = Sealer.seal_field(dek, key, _LABELS, labels_text)
                keys.append(data_key_marks(dek.unit))
                sealed_by = [dek.unit, dek.dek_id]
            args = [key, "1" if title[0] else "0", title_text, "1" if labels[0] else "0", labels_text, *sealed_by]
            reply = await self._guard(self._set_metadata(keys=keys, args=args))
            if int(reply[0]) < 0:
                raise _StaleDataKey(int(reply[1]))
            return reply

        sealing = self.sealer is not None and bool(title_plain or labels_plain)
        reply = await (self._sealed(key, store) if sealing else store(None))
        if not int(reply[0]):
            return None
        created, entries, stored_title, stored_labels, updated = reply[1:]
        return await self._record([key, updated, created, entries, stored_title, stored_labels])

    async def _record(self, row: Sequence[Any]) -> CatalogueRecord:
        """A catalogue row as the caller sees it: its title and labels opened when sealed (None and no
        labels when their data key was erased)."""
        if self.sealer is None:
            return _record(row)
        key, updated, created, entries, title, labels = (_text(part) for part in row)
        opened_title = await self.sealer.open_field(key, _TITLE, title) if title else ""
        opened_labels = await self.sealer.open_field(key, _LABELS, labels) if labels else ""
        return _record([key, updated, created, entries, opened_title or "", opened_labels or ""])

    async def scan(self, match: str, cursor: int, count: int) -> tuple[int, list[str]]:
        next_cursor, keys = await self._guard(self._client.scan(cursor=cursor, match=match, count=count))
        return int(next_cursor), [k.decode() if isinstance(k, bytes) else str(k) for k in keys]

    async def read_all(self, key: str) -> ReadResult:
        raw: list[bytes] = await self._guard(self._client.lrange(key, 0, -1))
        version = version_of(raw[-1]) if raw else 0
        return ReadResult(version=version, raw_entries=await self._open(key, raw))

    async def export_page(
        self,
        key: str,
        offset: int,
        page_bytes: int,
        first_step: int,
        max_step: int,
        summary: bool,
        unless: tuple[str, int, str | None] | None = None,
    ) -> ExportPage:
        """The entries from ``offset`` until they pass ``page_bytes`` (read in steps of ``first_step`` up to
        ``max_step`` entries), the list's length and version, and with ``summary`` its compaction summary,
        in one round trip. (With sealing, an entry whose data key was erased is left out, so a page may hold
        fewer than its offsets span.) ``unless``: the (life, version, summary digest) of an If-None-Match;
        when the conversation is in that state, nothing is read (``ExportPage.unchanged``). Only where
        the summary is read in the same step (or there is none to read)."""
        summaries = usage_keys_of(key)[3] if summary and self.ledger is not None else None
        keys = [key, summaries] if summaries is not None and self._counted else [key]
        args: list[Any] = [offset, page_bytes, first_step, max_step, key if len(keys) > 1 else "", ""]
        if self._sizes:
            keys.append(sizes_key_of(key))
            args[5] = READ_COPY_BYTES if isinstance(self._client, PipelinedValkey) else ""
        if unless is not None and (summaries is None or self._counted):
            args += [unless[0], unless[1], unless[2] or ""]
        reply = await self._guard(self._export_page(keys=keys, args=args))
        if int(reply[0]) == -2:
            assert unless is not None
            return ExportPage(0, unless[1], [], None, life=unless[0], summary_digest=unless[2], unchanged=True)
        if int(reply[5]) >= 0:
            reply = await self._guard(self._export_big(key, keys, args))
        length, tail, raw, next_offset, head = reply[:5]
        if summaries is not None and not self._counted:
            head = await self._guard(self._summary_of(keys=[summaries], args=[key]))
        summary_of = await self._open(key, [bytes(head)]) if head else []
        return ExportPage(
            length=int(length),
            version=version_of(tail) if tail else 0,
            raw_entries=await self._open(key, list(raw)),
            next_offset=None if int(next_offset) < 0 else int(next_offset),
            raw_summary=summary_of[0] if summary_of else None,
            life=life_of(tail),
            summary_digest=summary_digest(bytes(head)) if head else None,
        )

    async def _export_big(self, key: str, keys: list[str], args: list[Any]) -> list[Any]:
        """An export page too large to copy in a script, read as ``_read_big`` reads a window: planned
        under WATCH, then read by plain commands in one MULTI/EXEC. Answers ``_EXPORT_PAGE``'s reply."""
        assert isinstance(self._client, PipelinedValkey)
        sizes, offset, summaries = keys[-1], int(args[0]), keys[1] if args[4] else None
        plan = ["EVALSHA_RO", self._export_page.sha, len(keys), *keys, *args[:5], 0]
        async with self._client.exclusive() as session:
            for _ in range(READ_ATTEMPTS):
                planned = await self._planned(session, key, plan)
                if planned is None:
                    continue
                if int(planned[5]) < 0:
                    await session.run(("UNWATCH",))
                    return list(planned)
                n, count, next_offset = int(planned[0]), int(planned[5]), planned[3]
                last = offset + count - 1
                reads: list[tuple[Any, ...]] = [
                    ("LRANGE", key, offset, last),
                    ("LRANGE", sizes, offset - n, last - n),
                    ("LINDEX", key, -1),
                ]
                if summaries:
                    reads.append(("HGET", summaries, key))
                done = (await session.run(("MULTI",), *reads, ("EXEC",)))[-1]
                if done is None:
                    continue
                page, known = list(done[0]), done[1]
                if len(page) != count or any(len(raw) != int(size) for raw, size in zip(page, known, strict=False)):
                    return list(await self._guard(self._export_page(keys=keys, args=[*args[:5], ""])))
                summary = (done[3] or b"") if summaries else b""
                return [n, done[2] or b"", page, next_offset, summary, -1]
        raise ConversationBusy(f"the conversation changed during each of {READ_ATTEMPTS} reads of an export page")

    async def read_range(self, key: str, start: int, stop: int) -> list[bytes]:
        """Entries ``start`` to ``stop`` (LRANGE indexes, inclusive): one page of an export. (With sealing,
        an entry whose data key was erased is left out, so a page may hold fewer than asked for.)"""
        raw: list[bytes] = await self._guard(self._client.lrange(key, start, stop))
        return await self._open(key, raw)

    async def replace(
        self,
        key: str,
        entries: Sequence[EntryToStore],
        author: str,
        expected_version: int | None,
        cap: int,
        ttl_seconds: int,
        quota: StorageQuota | None = None,
    ) -> AppendResult:
        expected = "*" if expected_version is None else str(expected_version)

        def write(dek: DataKey | None) -> Awaitable[Any]:
            seal = None if dek is None else Sealer.sealing(dek, key)
            entry_args = _entry_args(entries, author, _now_ms(), seal=seal)
            args: list[Any] = [expected, cap, ttl_seconds, new_message_id(), *entry_args]
            return self._write(self._replace, key, args, quota, dek)

        version, stored, size = await (write(None) if self.sealer is None else self._sealed(key, write))
        if int(version) < 0:
            raise VersionConflict(f"conversation is at version {stored}, not {expected_version}")
        if self.ledger is not None and not self._counted:
            await self._account(self.ledger.sized(key, int(size), ttl_seconds, min(len(entries), cap)))
        return AppendResult(version=int(version), stored=int(stored))

    async def delete(self, key: str, expected_version: int | None = None) -> int:
        """Entries removed; VersionConflict (nothing removed) when ``expected_version`` is not the current."""
        expected = "*" if expected_version is None else str(expected_version)
        reply = await self._guard(self._delete(keys=self._written(key), args=[expected]))
        removed, version = int(reply[0]), int(reply[1])
        if removed < 0:
            raise VersionConflict(f"conversation is at version {version}, not {expected_version}")
        if self.ledger is not None and not self._counted:
            await self._account(self.ledger.forget(key))
        return removed

    async def pop(self, key: str, expected_version: int | None = None) -> PopResult:
        """Remove the newest entry (a write: the version moves on); VersionConflict on a mismatch."""
        expected = "*" if expected_version is None else str(expected_version)
        reply = await self._shrink(self._pop, key, [expected, new_message_id()])
        if int(reply[0]) < 0:
            raise VersionConflict(f"conversation is at version {reply[1]}, not {expected_version}")
        version, length, raw, removed, delta, ttl = reply
        if self.ledger is not None and not self._counted and int(removed):
            await self._account(self._shrunk(key, int(delta), int(ttl), int(length)))
        opened = await self._open(key, [bytes(raw)]) if int(removed) else []
        return PopResult(int(version), int(length), opened[0] if opened else None)

    async def rewind(self, key: str, to_version: int, expected_version: int | None = None) -> RewindResult:
        """Drop the entries written after ``to_version`` (a write when any were); VersionConflict on a mismatch."""
        expected = "*" if expected_version is None else str(expected_version)
        reply = await self._shrink(self._rewind, key, [expected, to_version, new_message_id()])
        if int(reply[0]) < 0:
            raise VersionConflict(f"conversation is at version {reply[1]}, not {expected_version}")
        version, removed, length, delta, ttl = (int(part) for part in reply)
        if self.ledger is not None and not self._counted and removed:
            await self._account(self._shrunk(key, delta, ttl, length))
        return RewindResult(version, removed, length)

    async def create(
        self, key: str, raw_entries: Sequence[bytes], cap: int, ttl_seconds: int, quota: StorageQuota | None = None
    ) -> AppendResult:
        """A new conversation holding ``raw_entries`` as they are (a fork's copies); ConversationExists when
        the key holds one already."""
        stored: Sequence[bytes] = raw_entries

        def write(dek: DataKey | None) -> Awaitable[Any]:
            nonlocal stored
            if dek is not None:
                stored = [Sealer.reseal(dek, key, raw) for raw in raw_entries]
            return self._write(self._create, key, [cap, ttl_seconds, new_message_id(), *stored], quota, dek)

        sealing = self.sealer is not None and bool(raw_entries)
        version, kept, *_ = await (self._sealed(key, write) if sealing else write(None))
        if int(version) < 0:
            raise ConversationExists("a conversation with that id exists already")
        if self.ledger is not None and not self._counted:
            size = sum(len(raw) for raw in stored[-cap:])
            await self._account(self.ledger.sized(key, size, ttl_seconds, int(kept)))
        return AppendResult(version=int(version), stored=int(kept), length=int(kept), created=True)

    async def _sealed(self, key: str, write: Callable[[DataKey], Awaitable[_T]]) -> _T:
        """A write that seals, sealed with its unit's data key (made on the unit's first write). Fail closed:
        Valkey stores it only while that key is the unit's current one (``_DATA_KEY_FUNCTIONS``). Refused,
        it is sealed again with the key the DEK store holds now, confirmed as the current one, once;
        refused again, it is DataKeyUnavailable and nothing is stored."""
        sealer = self.sealer
        assert sealer is not None
        try:
            return await write(sealer.cached_writing_key(key) or await sealer.writing_key(key))
        except _StaleDataKey as stale:
            dek = await self._confirmed_key(key, stale.generation)
        try:
            return await write(dek)
        except _StaleDataKey as again:
            raise DataKeyUnavailable("the data key was erased again while the write was retried") from again

    async def _confirmed_key(self, key: str, generation: int) -> DataKey:
        """The unit's DEK asked of the DEK store afresh (a new one when it has none: the erased unit's
        first write), made the unit's current one in Valkey unless an erasure moved its mark on meanwhile
        (then asked again, a bounded number of times)."""
        assert self.sealer is not None
        unit = data_key_unit(key)
        marks = data_key_marks(unit)
        for _ in range(_CONFIRM_ATTEMPTS):
            dek = await self.sealer.writing_key(key, fresh=True)
            args = [unit, generation, dek.dek_id, DATA_KEY_MARK_SECONDS]
            confirmed, generation = await self._guard(self._data_key_confirm(keys=[marks], args=args))
            if int(confirmed):
                return dek
            generation = int(generation)
        raise DataKeyUnavailable("the data key of this memory keeps being erased: retry later")

    async def erase_data_keys(self, unit: str) -> list[str]:
        """Destroy the data key of ``unit`` (of every unit of its space when ``unit`` is the space) and
        answer the units whose key was destroyed. The unit's mark is retired before (no write sealed with
        the old key is stored from then on, whichever replica cached it) and again after (a writer that
        confirmed the old key while the erasure ran is refused afterwards), so no write acknowledged after
        the erasure depends on the destroyed key."""
        if self.sealer is None:
            raise TypeError("a store that does not seal has no data keys")
        marks = data_key_marks(unit)
        scope = "" if data_key_space(unit) == unit else unit
        await self._guard(self._data_key_retire(keys=[marks], args=[scope, DATA_KEY_MARK_SECONDS]))
        destroyed = await self.sealer.erase(unit)
        await self._guard(self._data_key_retire(keys=[marks], args=[scope, DATA_KEY_MARK_SECONDS]))
        return destroyed

    async def _open(self, key: str, raw: list[bytes]) -> list[bytes]:
        return raw if self.sealer is None else await self.sealer.open(key, raw)

    def _shrunk(self, key: str, delta: int, ttl: int, length: int) -> Awaitable[Usage]:
        assert self.ledger is not None
        return self.ledger.forget(key) if ttl == 0 else self.ledger.added(key, delta, ttl, length)

    async def _shrink(self, script: Any, key: str, args: list[Any]) -> Any:
        """The reply of a write that only removes: with its accounting (no quota check) when counted."""
        if not self._counted:
            return await self._guard(script(keys=self._written(key), args=args))
        reply = await self._guard(script(keys=self._written(key), args=[0, 0, *args]))
        return reply[1]

    @staticmethod
    async def _account(update: Awaitable[Usage]) -> None:
        # The write itself succeeded: accounting that fails now is caught up by the conversation's next
        # write (or its expiry), so it never turns a stored write into an error.
        try:
            await update
        except (SessionMemError, ValkeyError) as exc:
            _LOG.warning("storage accounting not updated: %s", exc)

    async def ping(self) -> None:
        await self._guard(self._client.ping())

    def _written(self, key: str) -> list[str]:
        """KEYS of a write script: the conversation, its accounting's and catalogue's keys when counted,
        then its sizes and retry index when kept (``SIZES`` and ``RETRY`` of the scripts)."""
        keys = [key, *usage_keys_of(key)] if self._counted else [key]
        return [*keys, sizes_key_of(key), retry_index_of(key)] if self._sizes else keys

    async def _call(self, script: Any, key: str, args: list[Any]) -> Any:
        return await self._guard(script(keys=[key], args=args))

    async def _write(
        self, script: Any, key: str, args: list[Any], quota: StorageQuota | None, dek: DataKey | None = None
    ) -> Any:
        """The reply of a write script; a counted one runs behind the writer's storage ``quota``, a refusal
        raised as the typed QuotaExceeded with nothing written. Fail closed: a counted write without a
        quota is a programming error, never an unlimited write. ``dek``: the data key the write sealed
        with, which must be its unit's current one (``_StaleDataKey`` otherwise, nothing written): checked
        in the write's own step when counted; on a Cluster, where the conversation and the marks are two
        slots, by a call just before it."""
        if not self._counted:
            if dek is not None:
                marks, check = data_key_marks(dek.unit), [dek.unit, dek.dek_id]
                generation = int(await self._guard(self._data_key_check(keys=[marks], args=check)))
                if generation >= 0:
                    raise _StaleDataKey(generation)
            return await self._guard(script(keys=self._written(key), args=args))
        if quota is None:
            raise TypeError("a write to a store that accounts its writes needs the writer's storage quota")
        max_conversations, max_bytes = quota.max_conversations, quota.max_bytes
        # A counted store is a standalone server's, which keeps the sizes and the retry index: KEYS[7]
        # (``SIZES``) and KEYS[8] (``RETRY``), marks KEYS[9].
        keys = self._written(key)
        if dek is None:
            args = [max_conversations, max_bytes, *args]
        else:
            keys.append(data_key_marks(dek.unit))
            args = [max_conversations, max_bytes, dek.unit, dek.dek_id, *args]
        try:
            reply = await script(keys=keys, args=args)
        except _FAILURES as exc:
            _raise_backend_failure(exc)
        if int(reply[0]):
            if int(reply[0]) == 3:
                raise _StaleDataKey(int(reply[1]))
            raise refusal(int(reply[0]), max_conversations, max_bytes)
        return reply[1]

    @staticmethod
    async def _guard(awaitable: Any) -> Any:
        try:
            return await awaitable
        except _FAILURES as exc:
            _raise_backend_failure(exc)


# What a Valkey call may raise; ``_raise_backend_failure`` says what the caller sees. The hot paths (append,
# read) catch these themselves rather than through ``_guard``: one coroutine less per request.
_FAILURES = (ValkeyError, OSError)


def _raise_backend_failure(exc: ValkeyError | OSError) -> NoReturn:
    """Raise the typed error of a failed Valkey call: BackendUnavailable (503) when the backend is
    unreachable, not ready or full; any other error as it is."""
    if isinstance(exc, ValkeyConnectionError | ValkeyTimeoutError | OSError):
        raise BackendUnavailable(f"memory backend unavailable: {type(exc).__name__}") from exc
    text = str(exc)
    if "LOADING" in text or "MASTERDOWN" in text or "CLUSTERDOWN" in text:
        raise BackendUnavailable(f"memory backend not ready: {exc}") from exc
    if isinstance(exc, OutOfMemoryError) or "command not allowed when used memory" in text:
        # maxmemory reached (noeviction): nothing can be written until memory is freed. The server is up
        # but full, which the caller sees as the documented 503, never a 500.
        raise BackendUnavailable("memory backend is full (maxmemory reached)") from exc
    raise exc


def tokenize(text: str) -> set[str]:
    return {t for t in re.findall(r"\w+", text.lower()) if len(t) > 1}


class SearchRanking:
    """The best ``limit`` matches of a query over entries handed over a page at a time, oldest first: it
    keeps only those (a heap of ``limit``), so a search holds one page and its answer, not the whole
    conversation. Ranked by how many query terms an entry contains, newest first on ties."""

    __slots__ = ("_kept", "_limit", "_position", "_terms")

    def __init__(self, query: str, limit: int) -> None:
        self._terms = tokenize(query)
        self._limit = limit
        self._kept: list[tuple[int, int, bytes]] = []
        self._position = 0

    @property
    def searching(self) -> bool:
        return bool(self._terms) and self._limit > 0

    def add(self, raw_entries: Sequence[bytes]) -> None:
        if not self.searching:
            return
        terms, kept = self._terms, self._kept
        for raw in raw_entries:
            self._position += 1
            overlap = len(terms & tokenize(str(orjson.loads(raw).get("content", ""))))
            if not overlap:
                continue
            if len(kept) < self._limit:
                heapq.heappush(kept, (overlap, self._position, raw))
            else:
                heapq.heappushpop(kept, (overlap, self._position, raw))

    def best(self, max_bytes: int | None = None) -> list[bytes]:
        """The matches as stored, best first; with ``max_bytes``, only the best that fit in it (at least one)."""
        chosen: list[bytes] = []
        used = 0
        for _overlap, _position, raw in sorted(self._kept, reverse=True):
            used += len(raw)
            if max_bytes is not None and chosen and used > max_bytes:
                break
            chosen.append(raw)
        return chosen


def _record(row: Sequence[Any]) -> CatalogueRecord:
    key, updated, created, entries, title, labels = (_text(part) for part in row)
    return CatalogueRecord(
        key=key,
        updated=int(float(updated)) if updated else None,
        created=int(created) if created else None,
        entries=int(entries) if entries else None,
        title=title or None,
        labels=orjson.loads(labels) if labels else {},
    )


def _text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _texts(replies: Sequence[bytes | str]) -> tuple[str, ...]:
    return tuple(r.decode() if isinstance(r, bytes) else str(r) for r in replies)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
