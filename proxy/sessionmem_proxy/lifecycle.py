"""The other operations on a conversation (search, replace, delete, info, export) and the agent-wide and
user-wide ones (list, clear, erase a user). Each erasure says what it removed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence

import orjson
from pydantic import BaseModel

from sessionmem_core import api, wire
from sessionmem_core.errors import Forbidden, InvalidRequest, NotFound
from sessionmem_core.keys import (
    Scope,
    bucket_of,
    conversation_in,
    listing_key,
    parse_conversation_id,
    sibling_key,
    usage_keys_of,
)
from sessionmem_infra.serving import Reply, array_body, memory_reply, model_reply, not_modified_reply
from sessionmem_proxy.admission import ProxyContext, identify
from sessionmem_proxy.bulk import erase_space, export_page
from sessionmem_proxy.operations import (
    ClearParams,
    CompactParams,
    ConditionalParams,
    ConversationParams,
    EraseUserParams,
    ExportParams,
    ForkParams,
    ListParams,
    ReplaceParams,
    SearchParams,
    new_entries,
    operation,
    parse_if_match,
)
from sessionmem_proxy.store import READ_ANSWER_BYTES, CatalogueRecord, SearchRanking, without_rewound_at, written_at

# How many bytes of entries a search ranks before it lets the worker serve others (``search``).
SEARCH_SLICE_BYTES = 16 * 1024


def _slices(raw_entries: Sequence[bytes], size: int) -> Iterator[Sequence[bytes]]:
    """The entries in runs of about ``size`` bytes (at least one entry each), in order."""
    start, used = 0, 0
    for i, raw in enumerate(raw_entries):
        used += len(raw)
        if used >= size:
            yield raw_entries[start : i + 1]
            start, used = i + 1, 0
    if start < len(raw_entries):
        yield raw_entries[start:]


async def search(ctx: ProxyContext, p: SearchParams, _: BaseModel | None) -> Reply:
    """Keyword search over the whole conversation, read a page at a time as an export is (``export_page``):
    each page is charged to the agent's transfer rate as it is read, and the next read only once the
    agent's bucket is out of debt (``Quotas.pace``), so a search costs what an export of the same
    conversation does; at most ``STREAMS_PER_AGENT`` of an agent's searches and export pages run at once
    in a worker. The answer keeps the best matches that fit in ``READ_ANSWER_BYTES``.

    Ranking parses and tokenizes every entry, which costs far more CPU than moving its bytes (for prose,
    many times more): so its CPU time is charged to the agent's transfer rate as redaction's is
    (``Quotas.charge_cpu``), and a page is ranked a slice of ``SEARCH_SLICE_BYTES`` at a time, the worker
    serving what else waits in between. Ranked whole, a page held every other request on the worker for
    all of its ranking."""
    quotas = ctx.quotas
    async with operation(ctx, "search", p) as op:
        owner = op.identity.owner
        ranking = SearchRanking(p.q, p.limit)
        end = quotas.open_stream(owner)
        try:
            length, version, _ttl = await ctx.store.info(op.key)
            offset: int | None = 0 if ranking.searching and length else None
            while offset is not None:
                page = await export_page(ctx.store, op.key, offset)
                offset = page.next_offset
                await quotas.pace(owner, sum(map(len, page.raw_entries)))
                for part in _slices(page.raw_entries, SEARCH_SLICE_BYTES):
                    began = time.thread_time()
                    ranking.add(part)
                    quotas.charge_cpu(owner, op.limits, time.thread_time() - began)
                    await asyncio.sleep(0)
        finally:
            end()
        matches = ranking.best(READ_ANSWER_BYTES)
        op.span.entries, op.span.version = len(matches), version
        # The matches as stored (their items unchanged), in a SearchResponse document.
        head = b'{"conversationId":%s,"scope":"%s","query":%s,"matches":[' % (
            orjson.dumps(op.conversation),
            op.scope.encode(),
            orjson.dumps(p.q),
        )
        body = array_body(head, matches, b"]}")
        return memory_reply(body, op.scope, len(matches), version)


async def replace(ctx: ProxyContext, p: ReplaceParams, body: BaseModel | None) -> Reply:
    assert isinstance(body, wire.ReplaceRequest)  # the route table validated it
    expected = parse_if_match(p.if_match)
    async with operation(ctx, "replace", p) as op:
        _refuse_on_shared(op.scope)
        result = await ctx.store.replace(
            op.key,
            await new_entries(ctx, op, body.entries, p.redact),
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
    expected = parse_if_match(p.if_match)
    async with operation(ctx, "delete", p) as op:
        _refuse_on_shared(op.scope)
        removed = await ctx.store.delete(op.key, expected)
        op.span.entries = removed
        response = wire.DeleteResponse(deleted=removed > 0, entries=removed, scope=op.scope)
        return memory_reply(response, op.scope, removed, None)


async def pop(ctx: ProxyContext, p: ConditionalParams, _: BaseModel | None) -> Reply:
    expected = parse_if_match(p.if_match)
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
    expected = parse_if_match(p.if_match)
    async with operation(ctx, "rewind", p) as op:
        _refuse_on_shared(op.scope)
        result = await ctx.store.rewind(op.key, body.to_version, expected)
        op.span.entries, op.span.version = result.removed, result.version
        response = wire.RewindResponse(
            version=result.version, removed=result.removed, length=result.length, scope=op.scope
        )
        return memory_reply(response, op.scope, result.length, result.version)


async def compact(ctx: ProxyContext, p: CompactParams, body: BaseModel | None) -> Reply:
    """Record a summary of the entries up to a version; the entries stay (docs/summary.md)."""
    assert isinstance(body, wire.CompactRequest)  # the route table validated it
    async with operation(ctx, "compact", p) as op:
        _refuse_on_shared(op.scope)
        (summary,) = await new_entries(ctx, op, [body.summary], p.redact)
        version = await ctx.store.compact(op.key, summary, op.identity.owner.author, body.through_version, op.limits)
        op.span.version = version
        return memory_reply(wire.CompactResponse(version=version, scope=op.scope), op.scope, 0, version)


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
            # The first page carries the compaction summary too: an export answers everything kept.
            unless = None if p.if_none_match is None else api.etag_parts(p.if_none_match)
            page = await export_page(ctx.store, op.key, p.offset, summary=p.offset == 0, unless=unless)
            op.span.entries, op.span.version = len(page.raw_entries), page.version
            summary = page.raw_summary
            etag = None if page.life is None else api.etag(page.life, page.version, page.summary_digest)
            if etag is not None and (page.unchanged or p.if_none_match == etag):
                return not_modified_reply(etag, op.scope, page.version)
            head = b'{"conversationId":%s,"scope":"%s","version":%d,"entries":[' % (
                orjson.dumps(op.conversation),
                op.scope.encode(),
                page.version,
            )
            tail = b'],"nextOffset":%s%s}' % (
                b"null" if page.next_offset is None else b"%d" % page.next_offset,
                b',"summary":' + summary if summary else b"",
            )
            body = array_body(head, page.raw_entries, tail)
            await quotas.pace(owner, len(body))
        finally:
            end()
    return memory_reply(body, op.scope, page.length, page.version, etag)


def _catalogue_cursor(cursor: str) -> tuple[int, int] | None:
    if cursor == "0":
        return None
    score, _, taken = cursor.partition("-")
    return int(score), int(taken or "0")


async def list_conversations(ctx: ProxyContext, p: ListParams, _: BaseModel | None) -> Reply:
    """The caller's conversations (the agent's own, a user bucket's with a capability, or a registry's),
    newest write first, from the catalogue the writes keep (no keyspace scan)."""
    with ctx.tracer.span("list", "", p.traceparent) as span:
        identity = await identify(ctx, p.authorization)
        per_user = (await ctx.quotas.policy_of(identity.owner)).per_user
        key_prefix, scope_used = await ctx.keys.resolve_prefix(identity, p.scope, p.capability, per_user)
        expiries, _sizes, meta, _summaries, index = usage_keys_of(listing_key(key_prefix))
        page = await ctx.store.catalogue_page(index, expiries, meta, _catalogue_cursor(p.cursor), p.limit)
        span.scope, span.entries = scope_used, len(page.records)
        bucket = bucket_of(key_prefix)
        response = wire.ConversationList(
            conversations=[_ref(conversation_in(key_prefix, r.key), r, bucket) for r in page.records],
            nextCursor=None if page.cursor is None else f"{page.cursor[0]}-{page.cursor[1]}",
        )
        ctx.quotas.charge(identity.owner, 64 * len(page.records))
        return model_reply(response)


def _ref(conversation: str, record: CatalogueRecord, bucket: str | None) -> wire.ConversationRef:
    return wire.ConversationRef(
        conversationId=conversation,
        title=record.title,
        labels=record.labels,
        created=record.created,
        updated=record.updated,
        entries=record.entries,
        bucket=bucket,
    )


async def set_metadata(ctx: ProxyContext, p: ConversationParams, body: BaseModel | None) -> Reply:
    assert isinstance(body, wire.MetadataRequest)  # the route table validated it
    given = body.model_fields_set
    async with operation(ctx, "metadata", p) as op:
        record = await ctx.store.set_metadata(op.key, ("title" in given, body.title), ("labels" in given, body.labels))
        if record is None:
            raise NotFound(f"no conversation {op.conversation} in the catalogue")
        op.span.entries = record.entries
        return model_reply(_ref(op.conversation, record, bucket_of(op.key)))


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
        erased = await erase_space(ctx.store, user_prefix)
        span.scope, span.entries = Scope.SESSION.value, erased.entries
        ids = sorted(conversation_in(user_prefix, k) for k in erased.keys)
        return model_reply(
            wire.UserErasure(conversations=ids, entries=erased.entries, dataKeysDestroyed=erased.data_keys_destroyed)
        )
