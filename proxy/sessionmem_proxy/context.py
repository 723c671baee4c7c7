"""The proxy's parts, handed to routes by dependency injection (one per app, none global)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from sessionmem_core.env import ProxySettings
from sessionmem_core.errors import SessionMemError
from sessionmem_core.ids import validate_conversation_id
from sessionmem_core.keys import Scope
from sessionmem_core.store import ConversationStore
from sessionmem_core.telemetry import MemorySpan, MemoryTracer
from sessionmem_proxy.identity import AgentIdentity, Authenticator, bearer_token
from sessionmem_proxy.keying import KeyResolver
from sessionmem_proxy.metrics import ProxyMetrics
from sessionmem_proxy.redaction import Redaction


@dataclass
class ProxyContext:
    settings: ProxySettings
    store: ConversationStore
    authenticator: Authenticator
    keys: KeyResolver
    redaction: Redaction
    tracer: MemoryTracer
    metrics: ProxyMetrics


async def _context(request: Request) -> ProxyContext:
    ctx: ProxyContext = request.app.state.ctx
    return ctx


Ctx = Annotated[ProxyContext, Depends(_context)]


async def identify(ctx: ProxyContext, authorization: str | None) -> AgentIdentity:
    return await ctx.authenticator.authenticate(bearer_token(authorization))


@dataclass(slots=True)
class Operation:
    span: MemorySpan
    identity: AgentIdentity
    key: str
    scope: str


@asynccontextmanager
async def conversation_operation(
    ctx: ProxyContext,
    op: str,
    conversation_id: str,
    scope: Scope,
    authorization: str | None,
    capability: str | None,
    traceparent: str | None,
) -> AsyncIterator[Operation]:
    """One operation on one conversation, the same way for every route: its ``memory.<op>`` span and
    metrics, the id checked, the caller verified, and the key resolved from the verified identity."""
    started = time.perf_counter()
    outcome = "ok"
    try:
        with ctx.tracer.span(op, conversation_id, traceparent) as span:
            validate_conversation_id(conversation_id)
            identity = await identify(ctx, authorization)
            key, scope_used = await ctx.keys.resolve(identity, scope, conversation_id, capability)
            span.scope = scope_used
            yield Operation(span, identity, key, scope_used)
    except SessionMemError as exc:
        outcome = exc.error_type
        raise
    finally:
        ctx.metrics.observe(op, outcome, (time.perf_counter() - started) * 1000.0)
