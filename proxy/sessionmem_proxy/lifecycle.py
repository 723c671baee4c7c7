"""Lifecycle routes: existence and metadata, export, listing an agent's conversations, clearing them
all, and erasing everything of one end user. Each erasure says what it removed."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import FastAPI, Query
from fastapi.responses import Response
from pydantic import BaseModel

from sessionmem_core import api, wire
from sessionmem_core.errors import InvalidRequest
from sessionmem_core.keys import Scope, session_prefix
from sessionmem_proxy.context import Ctx, ProxyContext, conversation_operation, identify
from sessionmem_proxy.params import AuthHeader, CapabilityHeader, ConversationIdPath, ScopeQuery, TraceHeader

JSON = "application/json"
_SCAN_BATCH = 200
# A page scans at most this many batches, so one request stays bounded however sparse the keyspace.
_MAX_SCANS_PER_PAGE = 50


def _json(model: BaseModel) -> Response:
    return Response(content=model.model_dump_json(by_alias=True).encode(), media_type=JSON)


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


async def _delete_all(ctx: ProxyContext, prefix: str) -> tuple[list[str], int]:
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


def install_lifecycle_routes(app: FastAPI) -> None:
    prefix = api.API_PREFIX

    @app.get(
        f"{prefix}/conversations/{{conversation_id:path}}/export",
        response_model=wire.History,
        tags=["lifecycle"],
        summary="Export a whole conversation",
    )
    async def export(
        ctx: Ctx,
        conversation_id: ConversationIdPath,
        scope: ScopeQuery = Scope.SESSION,
        authorization: AuthHeader = None,
        traceparent: TraceHeader = None,
        x_sessionmem_user_capability: CapabilityHeader = None,
    ) -> Response:
        async with conversation_operation(
            ctx, "export", conversation_id, scope, authorization, x_sessionmem_user_capability, traceparent
        ) as operation:
            result = await ctx.store.read_all(operation.key)
            operation.span.entries, operation.span.version = len(result.raw_entries), result.version
            scope_used = operation.scope
            body = b'{"conversationId":%s,"scope":"%s","version":%d,"entries":%s}' % (
                orjson.dumps(conversation_id),
                scope_used.encode(),
                result.version,
                result.entries_json(),
            )
            return Response(content=body, media_type=JSON)

    @app.get(
        f"{prefix}/conversations/{{conversation_id:path}}",
        response_model=wire.ConversationInfo,
        tags=["lifecycle"],
        summary="Whether a conversation exists, its version, size and remaining TTL",
    )
    async def info(
        ctx: Ctx,
        conversation_id: ConversationIdPath,
        scope: ScopeQuery = Scope.SESSION,
        authorization: AuthHeader = None,
        traceparent: TraceHeader = None,
        x_sessionmem_user_capability: CapabilityHeader = None,
    ) -> Response:
        async with conversation_operation(
            ctx, "info", conversation_id, scope, authorization, x_sessionmem_user_capability, traceparent
        ) as operation:
            length, version, ttl = await ctx.store.info(operation.key)
            operation.span.entries, operation.span.version = length, version
            scope_used = operation.scope
            return _json(
                wire.ConversationInfo(
                    conversationId=conversation_id,
                    scope=scope_used,
                    exists=length > 0,
                    version=version,
                    entries=length,
                    ttlSeconds=ttl,
                )
            )

    @app.get(
        f"{prefix}/conversations",
        response_model=wire.ConversationList,
        tags=["lifecycle"],
        summary="List the caller's conversations (paginated)",
    )
    async def list_conversations(
        ctx: Ctx,
        limit: Annotated[
            int, Query(ge=1, le=500, description="Page size hint (Valkey SCAN): a page may hold a few more or fewer")
        ] = 50,
        cursor: Annotated[str, Query(pattern=r"^[0-9]{1,20}$")] = "0",
        scope: ScopeQuery = Scope.SESSION,
        authorization: AuthHeader = None,
        traceparent: TraceHeader = None,
        x_sessionmem_user_capability: CapabilityHeader = None,
    ) -> Response:
        if int(cursor) >= 2**64:
            raise InvalidRequest("cursor is not one this server returned")
        with ctx.tracer.span("list", "", traceparent) as span:
            identity = await identify(ctx, authorization)
            key_prefix, scope_used = await ctx.keys.resolve_prefix(identity, scope, x_sessionmem_user_capability)
            keys, next_cursor = await _conversations_under(ctx, key_prefix, int(cursor), limit, direct_only=True)
            span.scope, span.entries = scope_used, len(keys)
            return _json(
                wire.ConversationList(
                    conversations=[wire.ConversationRef(conversationId=k[len(key_prefix) :]) for k in sorted(keys)],
                    nextCursor=str(next_cursor) if next_cursor else None,
                )
            )

    @app.delete(
        f"{prefix}/conversations",
        response_model=wire.ClearResponse,
        tags=["lifecycle"],
        summary="Erase all of the agent's private conversations, per-user ones included (confirm=true)",
    )
    async def clear_all(
        ctx: Ctx,
        confirm: Annotated[bool, Query(description="Must be true: this erases every private conversation")] = False,
        authorization: AuthHeader = None,
        traceparent: TraceHeader = None,
    ) -> Response:
        if not confirm:
            raise InvalidRequest("clearing every conversation needs confirm=true")
        with ctx.tracer.span("clear", "", traceparent) as span:
            identity = await identify(ctx, authorization)
            removed, entries = await _delete_all(ctx, session_prefix(identity.owner))
            span.scope, span.entries = Scope.SESSION.value, entries
            return _json(wire.ClearResponse(conversations=len(removed), entries=entries))

    @app.delete(
        api.USER_CONVERSATIONS_PATH,
        response_model=wire.UserErasure,
        tags=["lifecycle"],
        summary="Erase everything of the end user named by the capability, across the agent's conversations",
    )
    async def erase_user(
        ctx: Ctx,
        authorization: AuthHeader = None,
        traceparent: TraceHeader = None,
        x_sessionmem_user_capability: CapabilityHeader = None,
    ) -> Response:
        with ctx.tracer.span("erase_user", "", traceparent) as span:
            identity = await identify(ctx, authorization)
            user_prefix = ctx.keys.user_prefix(identity, x_sessionmem_user_capability)
            removed, entries = await _delete_all(ctx, user_prefix)
            span.scope, span.entries = Scope.SESSION.value, entries
            ids = sorted(k[len(user_prefix) :] for k in removed)
            return _json(wire.UserErasure(conversations=ids, entries=entries))
