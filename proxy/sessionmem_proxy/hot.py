"""The two operations of every agent turn: reading the window and appending the exchange.

Handlers take the proxy's context, their typed parameters as the app parsed them (``sessionmem_proxy.params``)
and the validated body, and return a reply (``sessionmem_proxy.replies``).
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from pydantic import BaseModel

from sessionmem_core import wire
from sessionmem_proxy.context import ProxyContext, conversation_operation
from sessionmem_proxy.params import AppendParams, OnConversation, ReadParams
from sessionmem_proxy.redaction import strings_of, with_strings
from sessionmem_proxy.replies import Reply, memory_reply
from sessionmem_proxy.store import EntryToStore, NewEntry


def operation(ctx: ProxyContext, op: str, p: OnConversation) -> conversation_operation:
    """The operation on the conversation a request names, from the parameters every such route takes."""
    return conversation_operation(
        ctx, op, p.conversation_id, p.scope, p.authorization, p.capability, p.traceparent, p.verified
    )


async def new_entries(ctx: ProxyContext, entries: Sequence[wire.EntryIn], redact: str) -> Sequence[EntryToStore]:
    """The entries to store: the request's own, or redacted copies when the request asks for redaction,
    which covers each entry's content and every string value inside its item."""
    redactor = ctx.redaction.chain(redact.split(",")) if redact else None
    if redactor is None:
        return entries
    texts: list[str] = []
    for entry in entries:
        texts.append(entry.content)
        if entry.item is not None:
            strings_of(entry.item, texts)
    redacted = iter(await ctx.redaction.apply(redactor, texts))
    copies: list[EntryToStore] = []
    for entry in entries:
        content = next(redacted)
        item = None if entry.item is None else with_strings(entry.item, redacted)
        copies.append(NewEntry(role=entry.role, content=content, id=entry.id, item=item))
    return copies


async def read_entries(ctx: ProxyContext, p: ReadParams, _: BaseModel | None) -> Reply:
    async with operation(ctx, "get", p) as op:
        limit = p.limit
        store = ctx.store
        result = await (store.read_with_summary(op.key, limit) if p.summary else store.read(op.key, limit))
        op.span.entries, op.span.version = len(result.raw_entries), result.version
        summary_part = (b',"summary":' + result.raw_summary) if result.raw_summary else b""
        body = b"".join(
            (
                b'{"conversationId":',
                orjson.dumps(op.conversation),
                b',"scope":"',
                op.scope.encode(),
                b'","version":',
                str(result.version).encode(),
                b',"entries":',
                result.entries_json(),
                summary_part,
                b"}",
            )
        )
        ctx.quotas.charge(op.identity.owner, len(body))
        return memory_reply(body, op.scope, len(result.raw_entries), result.version)


async def append_entries(ctx: ProxyContext, p: AppendParams, body: BaseModel | None) -> Reply:
    assert isinstance(body, wire.AppendRequest)  # the route table validated it
    async with operation(ctx, "append", p) as op:
        result = await ctx.store.append(
            op.key,
            await new_entries(ctx, body.entries, p.redact),
            author=op.identity.owner.author,
            cap=p.cap,
            ttl_seconds=p.ttl_seconds,
            quota=op.limits,
            idempotency_key=p.idempotency_key,
        )
        op.span.entries, op.span.version = result.stored, result.version
        duplicate = b"true" if result.duplicate else b"false"
        return memory_reply(
            b'{"version":%d,"stored":%d,"duplicate":%s,"scope":"%s","length":%d,"duplicateIds":%s}'
            % (
                result.version,
                result.stored,
                duplicate,
                op.scope.encode(),
                result.length,
                orjson.dumps(result.duplicate_ids) if result.duplicate_ids else b"[]",
            ),
            op.scope,
            result.stored,
            result.version,
        )
