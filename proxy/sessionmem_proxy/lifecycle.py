"""The other operations on a conversation (search, replace, delete, info, export) and the agent-wide and
user-wide ones (list, clear, erase a user). Each erasure says what it removed."""

from __future__ import annotations

import orjson
from pydantic import BaseModel

from sessionmem_core import api, wire
from sessionmem_core.errors import Forbidden, InvalidRequest
from sessionmem_core.keys import Scope
from sessionmem_proxy.context import ProxyContext, identify
from sessionmem_proxy.hot import Params, new_entries, operation
from sessionmem_proxy.replies import Reply, memory_reply, model_reply
from sessionmem_proxy.store import search_entries

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


async def export_page(ctx: ProxyContext, key: str, offset: int, length: int) -> tuple[list[bytes], int | None]:
    """The stored entries of one export page, from ``offset`` of a list of ``length``; and the offset of the
    next page, None once this one reached the end. Not a snapshot: entries written or trimmed between
    pages shift the offsets, so a busy conversation's export may repeat or miss an entry at a page edge."""
    page: list[bytes] = []
    at, taken, step = offset, 0, EXPORT_FIRST_STEP_ENTRIES
    while taken < EXPORT_PAGE_BYTES and at < length:
        got = await ctx.store.read_range(key, at, min(at + step, length) - 1)
        if not got:
            return page, None  # trimmed meanwhile: the list ends here now
        page += got
        at += len(got)
        taken += sum(map(len, got))
        step = max(1, min(EXPORT_MAX_STEP_ENTRIES, (EXPORT_PAGE_BYTES - taken) // max(map(len, got))))
    return page, at if at < length else None


async def search(ctx: ProxyContext, p: Params, _: BaseModel | None) -> Reply:
    async with operation(ctx, "search", p) as op:
        result = await ctx.store.read_all(op.key)
        matches = search_entries(result.raw_entries, p["q"], p["limit"])
        op.span.entries, op.span.version = len(matches), result.version
        response = wire.SearchResponse(
            conversationId=p["conversation_id"],
            scope=op.scope,
            query=p["q"],
            matches=[wire.Entry.model_validate(m) for m in matches],
        )
        return memory_reply(response, op.scope, len(matches), result.version)


def _parse_if_match(if_match: str | None) -> int | None:
    if if_match is None or if_match.strip() in ("", "*"):
        return None
    value = if_match.strip().removeprefix("W/").strip('"')
    if not (value.isascii() and value.isdigit()):
        raise InvalidRequest("If-Match must be a version number, or '*'")
    return int(value)


async def replace(ctx: ProxyContext, p: Params, body: BaseModel | None) -> Reply:
    assert isinstance(body, wire.ReplaceRequest)  # the route table validated it
    expected = _parse_if_match(p["if_match"])
    async with operation(ctx, "replace", p) as op:
        _refuse_on_shared(op.scope)
        result = await ctx.store.replace(
            op.key,
            await new_entries(ctx, body.entries, p["redact"]),
            author=op.identity.owner.author,
            expected_version=expected,
            cap=p["cap"],
            ttl_seconds=p["ttl_seconds"],
        )
        op.span.entries, op.span.version = result.stored, result.version
        response = wire.ReplaceResponse(version=result.version, stored=result.stored, scope=op.scope)
        return memory_reply(response, op.scope, result.stored, result.version)


def _refuse_on_shared(scope: str) -> None:
    """A shared conversation is its team's: a member appends and reads it; rewriting or erasing it for
    everyone is an administrator's act (admin.erase_registry_memory)."""
    if scope == Scope.SHARED.value:
        raise Forbidden(
            "a shared conversation is its team's: members append and read it; replacing or deleting it is an "
            f"administrator's operation (DELETE {api.ADMIN_REGISTRY_MEMORY_PATH})"
        )


async def delete(ctx: ProxyContext, p: Params, _: BaseModel | None) -> Reply:
    async with operation(ctx, "delete", p) as op:
        _refuse_on_shared(op.scope)
        removed = await ctx.store.delete(op.key)
        op.span.entries = removed
        response = wire.DeleteResponse(deleted=removed > 0, entries=removed, scope=op.scope)
        return memory_reply(response, op.scope, removed, None)


async def info(ctx: ProxyContext, p: Params, _: BaseModel | None) -> Reply:
    async with operation(ctx, "info", p) as op:
        length, version, ttl = await ctx.store.info(op.key)
        op.span.entries, op.span.version = length, version
        return model_reply(
            wire.ConversationInfo(
                conversationId=p["conversation_id"],
                scope=op.scope,
                exists=length > 0,
                version=version,
                entries=length,
                ttlSeconds=ttl,
            )
        )


async def export(ctx: ProxyContext, p: Params, _: BaseModel | None) -> Reply:
    """One page of the conversation as a ``History`` document, with ``nextOffset`` to ask for the next.

    Each page is charged to the agent's transfer rate once read, and answered only once the agent's
    bucket is out of debt: an export of any size is paced, never refused half-way (its pages are not
    refused by the transfer rate, only by the request rate). At most ``STREAMS_PER_AGENT`` pages of an
    agent are read at once in a worker."""
    quotas = ctx.quotas
    async with operation(ctx, "export", p) as op:
        owner = op.identity.owner
        end = quotas.open_stream(owner) if quotas is not None else None
        try:
            length, version, _ttl = await ctx.store.info(op.key)
            page, next_offset = await export_page(ctx, op.key, p["offset"], length)
            op.span.entries, op.span.version = len(page), version
            body = b'{"conversationId":%s,"scope":"%s","version":%d,"entries":[%s],"nextOffset":%s}' % (
                orjson.dumps(p["conversation_id"]),
                op.scope.encode(),
                version,
                b",".join(page),
                b"null" if next_offset is None else b"%d" % next_offset,
            )
            if quotas is not None:
                await quotas.pace(owner, len(body))
        finally:
            if end is not None:
                end()
    return memory_reply(body, op.scope, length, version)


async def _conversations_under(
    ctx: ProxyContext, prefix: str, cursor: int, limit: int, direct_only: bool
) -> tuple[list[str], int]:
    """Keys directly under ``prefix`` (no nested per-user keys when ``direct_only``), one page."""
    found: list[str] = []
    for _ in range(_MAX_SCANS_PER_PAGE):
        cursor, keys = await ctx.store.scan(prefix + "*", cursor, max(1, limit - len(found)))
        found += [k for k in keys if not direct_only or ":" not in k[len(prefix) :]]
        if cursor == 0 or len(found) >= limit:
            break
    return found, cursor


async def delete_all(ctx: ProxyContext, prefix: str) -> tuple[list[str], int]:
    removed_keys: list[str] = []
    entries = 0
    cursor = 0
    while True:
        cursor, keys = await ctx.store.scan(prefix + "*", cursor, _SCAN_BATCH)
        for key in keys:
            count = await ctx.store.delete(key)
            if count:
                removed_keys.append(key)
                entries += count
        if cursor == 0:
            return removed_keys, entries


async def list_conversations(ctx: ProxyContext, p: Params, _: BaseModel | None) -> Reply:
    cursor = int(p["cursor"])
    if cursor >= 2**64:
        raise InvalidRequest("cursor is not one this server returned")
    with ctx.tracer.span("list", "", p["traceparent"]) as span:
        identity = await identify(ctx, p["authorization"])
        key_prefix, scope_used = await ctx.keys.resolve_prefix(identity, p["scope"], p["capability"])
        keys, next_cursor = await _conversations_under(ctx, key_prefix, cursor, p["limit"], direct_only=True)
        span.scope, span.entries = scope_used, len(keys)
        return model_reply(
            wire.ConversationList(
                conversations=[wire.ConversationRef(conversationId=k[len(key_prefix) :]) for k in sorted(keys)],
                nextCursor=str(next_cursor) if next_cursor else None,
            )
        )


async def clear_all(ctx: ProxyContext, p: Params, _: BaseModel | None) -> Reply:
    """Refused to every agent: erasing all of an agent's memory is an administrator's act (admin.py)."""
    if not p["confirm"]:
        raise InvalidRequest("clearing every conversation needs confirm=true")
    identity = await identify(ctx, p["authorization"])
    raise Forbidden(
        f"erasing all of {identity.owner.author}'s memory is an administrator's operation: "
        f"DELETE {api.ADMIN_AGENT_MEMORY_PATH} with a person's own Kubernetes credential"
    )


async def erase_user(ctx: ProxyContext, p: Params, _: BaseModel | None) -> Reply:
    with ctx.tracer.span("erase_user", "", p["traceparent"]) as span:
        identity = await identify(ctx, p["authorization"])
        user_prefix = ctx.keys.user_prefix(identity, p["capability"])
        removed, entries = await delete_all(ctx, user_prefix)
        span.scope, span.entries = Scope.SESSION.value, entries
        ids = sorted(k[len(user_prefix) :] for k in removed)
        return model_reply(wire.UserErasure(conversations=ids, entries=entries))
