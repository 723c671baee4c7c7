"""The other operations on a conversation (search, replace, delete, info, export) and the agent-wide and
user-wide ones (list, clear, erase a user). Each erasure says what it removed."""

from __future__ import annotations

import orjson
from pydantic import BaseModel

from sessionmem_core import api, wire
from sessionmem_core.errors import Forbidden, InvalidRequest
from sessionmem_core.ids import parse_conversation_id
from sessionmem_core.keys import Scope
from sessionmem_proxy.bulk import conversations_under, delete_all, export_page
from sessionmem_proxy.context import ProxyContext, identify
from sessionmem_proxy.hot import new_entries, operation
from sessionmem_proxy.keying import conversation_in, sibling_key
from sessionmem_proxy.params import (
    ClearParams,
    ConditionalParams,
    ConversationParams,
    EraseUserParams,
    ExportParams,
    ForkParams,
    ListParams,
    ReplaceParams,
    SearchParams,
)
from sessionmem_proxy.replies import Reply, memory_reply, model_reply
from sessionmem_proxy.store import search_entries, without_rewound_at, written_at


async def search(ctx: ProxyContext, p: SearchParams, _: BaseModel | None) -> Reply:
    async with operation(ctx, "search", p) as op:
        result = await ctx.store.read_all(op.key)
        matches = search_entries(result.raw_entries, p.q, p.limit)
        op.span.entries, op.span.version = len(matches), result.version
        # The matches as stored (their items unchanged), in a SearchResponse document.
        body = b'{"conversationId":%s,"scope":"%s","query":%s,"matches":[%s]}' % (
            orjson.dumps(op.conversation),
            op.scope.encode(),
            orjson.dumps(p.q),
            b",".join(matches),
        )
        return memory_reply(body, op.scope, len(matches), result.version)


def _parse_if_match(if_match: str | None) -> int | None:
    if if_match is None or if_match.strip() in ("", "*"):
        return None
    value = if_match.strip().removeprefix("W/").strip('"')
    if not (value.isascii() and value.isdigit()):
        raise InvalidRequest("If-Match must be a version number, or '*'")
    return int(value)


async def replace(ctx: ProxyContext, p: ReplaceParams, body: BaseModel | None) -> Reply:
    assert isinstance(body, wire.ReplaceRequest)  # the route table validated it
    expected = _parse_if_match(p.if_match)
    async with operation(ctx, "replace", p) as op:
        _refuse_on_shared(op.scope)
        result = await ctx.store.replace(
            op.key,
            await new_entries(ctx, body.entries, p.redact),
            author=op.identity.owner.author,
            expected_version=expected,
            cap=p.cap,
            ttl_seconds=p.ttl_seconds,
            quota=op.limits,
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


async def delete(ctx: ProxyContext, p: ConditionalParams, _: BaseModel | None) -> Reply:
    expected = _parse_if_match(p.if_match)
    async with operation(ctx, "delete", p) as op:
        _refuse_on_shared(op.scope)
        removed = await ctx.store.delete(op.key, expected)
        op.span.entries = removed
        response = wire.DeleteResponse(deleted=removed > 0, entries=removed, scope=op.scope)
        return memory_reply(response, op.scope, removed, None)


async def pop(ctx: ProxyContext, p: ConditionalParams, _: BaseModel | None) -> Reply:
    expected = _parse_if_match(p.if_match)
    async with operation(ctx, "pop", p) as op:
        _refuse_on_shared(op.scope)
        result = await ctx.store.pop(op.key, expected)
        op.span.entries, op.span.version = 0 if result.raw_entry is None else 1, result.version
        body = b'{"entry":%s,"version":%d,"length":%d,"scope":"%s"}' % (
            b"null" if result.raw_entry is None else result.raw_entry,
            result.version,
            result.length,
            op.scope.encode(),
        )
        return memory_reply(body, op.scope, result.length, result.version)


async def rewind(ctx: ProxyContext, p: ConditionalParams, body: BaseModel | None) -> Reply:
    assert isinstance(body, wire.RewindRequest)  # the route table validated it
    expected = _parse_if_match(p.if_match)
    async with operation(ctx, "rewind", p) as op:
        _refuse_on_shared(op.scope)
        result = await ctx.store.rewind(op.key, body.to_version, expected)
        op.span.entries, op.span.version = result.removed, result.version
        response = wire.RewindResponse(
            version=result.version, removed=result.removed, length=result.length, scope=op.scope
        )
        return memory_reply(response, op.scope, result.length, result.version)


async def fork(ctx: ProxyContext, p: ForkParams, body: BaseModel | None) -> Reply:
    """The source's entries written at or before ``atVersion`` (as they were written: a pop's or a
    rewind's stamp dropped), copied into a new conversation of the same space. Read, then created only
    where nothing is: a snapshot of the source, whatever is written to it meanwhile."""
    assert isinstance(body, wire.ForkRequest)  # the route table validated it
    async with operation(ctx, "fork", p) as op:
        target = parse_conversation_id(body.conversation_id)
        target_key = sibling_key(op.key, op.conversation, target)
        source = await ctx.store.read_all(op.key)
        at = body.at_version
        copies = [without_rewound_at(raw) for raw in source.raw_entries if at is None or written_at(raw) <= at]
        await ctx.quotas.check_storage(op.limits, target_key)
        result = await ctx.store.create(target_key, copies, p.cap, p.ttl_seconds, op.limits)
        op.span.entries, op.span.version = result.stored, result.version
        response = wire.ForkResponse(
            conversationId=target, version=result.version, entries=result.stored, scope=op.scope
        )
        return memory_reply(response, op.scope, result.stored, result.version)


async def info(ctx: ProxyContext, p: ConversationParams, _: BaseModel | None) -> Reply:
    async with operation(ctx, "info", p) as op:
        length, version, ttl = await ctx.store.info(op.key)
        op.span.entries, op.span.version = length, version
        return model_reply(
            wire.ConversationInfo(
                conversationId=op.conversation,
                scope=op.scope,
                exists=length > 0,
                version=version,
                entries=length,
                ttlSeconds=ttl,
            )
        )


async def export(ctx: ProxyContext, p: ExportParams, _: BaseModel | None) -> Reply:
    """One page of the conversation as a ``History`` document, with ``nextOffset`` to ask for the next.

    Each page is charged to the agent's transfer rate once read, and answered only once the agent's
    bucket is out of debt: an export of any size is paced, never refused half-way (its pages are not
    refused by the transfer rate, only by the request rate). At most ``STREAMS_PER_AGENT`` pages of an
    agent are read at once in a worker."""
    quotas = ctx.quotas
    async with operation(ctx, "export", p) as op:
        owner = op.identity.owner
        end = quotas.open_stream(owner)
        try:
            length, version, _ttl = await ctx.store.info(op.key)
            page, next_offset = await export_page(ctx.store, op.key, p.offset, length)
            op.span.entries, op.span.version = len(page), version
            body = b'{"conversationId":%s,"scope":"%s","version":%d,"entries":[%s],"nextOffset":%s}' % (
                orjson.dumps(op.conversation),
                op.scope.encode(),
                version,
                b",".join(page),
                b"null" if next_offset is None else b"%d" % next_offset,
            )
            await quotas.pace(owner, len(body))
        finally:
            end()
    return memory_reply(body, op.scope, length, version)


async def list_conversations(ctx: ProxyContext, p: ListParams, _: BaseModel | None) -> Reply:
    cursor = int(p.cursor)
    if cursor >= 2**64:
        raise InvalidRequest("cursor is not one this server returned")
    with ctx.tracer.span("list", "", p.traceparent) as span:
        identity = await identify(ctx, p.authorization)
        per_user = (await ctx.quotas.policy_of(identity.owner)).per_user
        key_prefix, scope_used = await ctx.keys.resolve_prefix(identity, p.scope, p.capability, per_user)
        keys, next_cursor = await conversations_under(ctx.store, key_prefix, cursor, p.limit, direct_only=True)
        span.scope, span.entries = scope_used, len(keys)
        return model_reply(
            wire.ConversationList(
                conversations=[
                    wire.ConversationRef(conversationId=conversation_in(key_prefix, k)) for k in sorted(keys)
                ],
                nextCursor=str(next_cursor) if next_cursor else None,
            )
        )


async def clear_all(ctx: ProxyContext, p: ClearParams, _: BaseModel | None) -> Reply:
    """Refused to every agent: erasing all of an agent's memory is an administrator's act (admin.py)."""
    if not p.confirm:
        raise InvalidRequest("clearing every conversation needs confirm=true")
    identity = await identify(ctx, p.authorization)
    raise Forbidden(
        f"erasing all of {identity.owner.author}'s memory is an administrator's operation: "
        f"DELETE {api.ADMIN_AGENT_MEMORY_PATH} with a person's own Kubernetes credential"
    )


async def erase_user(ctx: ProxyContext, p: EraseUserParams, _: BaseModel | None) -> Reply:
    with ctx.tracer.span("erase_user", "", p.traceparent) as span:
        identity = await identify(ctx, p.authorization)
        user_prefix = ctx.keys.user_prefix(identity, p.capability)
        removed, entries = await delete_all(ctx.store, user_prefix)
        span.scope, span.entries = Scope.SESSION.value, entries
        ids = sorted(conversation_in(user_prefix, k) for k in removed)
        return model_reply(wire.UserErasure(conversations=ids, entries=entries))
