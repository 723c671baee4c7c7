"""Operations over many entries or many keys, shared by the agents' routes (``lifecycle``) and the
administrators' (``admin``): an export page, a page of a space's conversations, erasing a space."""

from __future__ import annotations

from dataclasses import dataclass

from sessionmem_core.keys import data_key_unit_of_space, keys_under
from sessionmem_proxy.store import ConversationStore, ExportPage

_SCAN_BATCH = 200
# A page scans at most this many batches, so one request stays bounded however sparse the keyspace.
_MAX_SCANS_PER_PAGE = 50
# An export is paged: each request answers entries from an offset up to about EXPORT_PAGE_BYTES, and the
# offset of the next page, so the proxy holds about one page per request whatever the conversation's
# length (granian's RSGI has no flow control for a streamed answer, so nothing is streamed). A page is read
# in steps sized from the largest entry so far, starting small because entries may be up to
# MAX_CONTENT_CHARS each.
EXPORT_PAGE_BYTES = 1024 * 1024
EXPORT_FIRST_STEP_ENTRIES = 4
EXPORT_MAX_STEP_ENTRIES = 256


async def export_page(
    store: ConversationStore,
    key: str,
    offset: int,
    summary: bool = False,
    unless: tuple[str, int, str | None] | None = None,
) -> ExportPage:
    """One export page from ``offset`` (its next page's offset None once it reached the end), with the
    list's length and version, in one round trip; with ``summary``, also the compaction summary. Not a
    snapshot across pages: entries written or trimmed between pages shift the offsets, so a busy
    conversation's export may repeat or miss an entry at a page edge. ``unless``: as the store takes it."""
    return await store.export_page(
        key, offset, EXPORT_PAGE_BYTES, EXPORT_FIRST_STEP_ENTRIES, EXPORT_MAX_STEP_ENTRIES, summary, unless
    )


async def conversations_under(
    store: ConversationStore, prefix: str, cursor: int, limit: int, direct_only: bool
) -> tuple[list[str], int]:
    """Keys directly under ``prefix`` (no nested per-user keys when ``direct_only``), one page."""
    found: list[str] = []
    for _ in range(_MAX_SCANS_PER_PAGE):
        cursor, keys = await store.scan(keys_under(prefix), cursor, max(1, limit - len(found)))
        found += [k for k in keys if not direct_only or ":" not in k[len(prefix) :]]
        if cursor == 0 or len(found) >= limit:
            break
    return found, cursor


async def delete_all(store: ConversationStore, prefix: str) -> tuple[list[str], int]:
    removed_keys: list[str] = []
    entries = 0
    cursor = 0
    while True:
        cursor, keys = await store.scan(keys_under(prefix), cursor, _SCAN_BATCH)
        for key in keys:
            count = await store.delete(key)
            if count:
                removed_keys.append(key)
                entries += count
        if cursor == 0:
            return removed_keys, entries


@dataclass(frozen=True, slots=True)
class Erasure:
    """What erasing a space (an agent's, a registry's, or one user's bucket) removed."""

    keys: list[str]
    entries: int
    # The units whose data key was destroyed; None when the proxy does not seal (encryption at rest off).
    data_keys_destroyed: list[str] | None


async def erase_space(store: ConversationStore, prefix: str) -> Erasure:
    """Erase every conversation under ``prefix``. With sealing, the space's data keys are destroyed first:
    that is what makes the entries unreadable in the AOF, the snapshots, the replicas and the backups, and
    what a failure must stop (fail closed: nothing is reported erased while its key survives). A write
    that races the erasure is stored under the old key only while the erasure runs (and is erased with
    it); from the receipt on, Valkey refuses the old key and the writer seals under a new one."""
    destroyed = await store.erase_data_keys(data_key_unit_of_space(prefix)) if store.sealer is not None else None
    removed, entries = await delete_all(store, prefix)
    return Erasure(removed, entries, destroyed)
