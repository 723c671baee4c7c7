"""The proxy's parts, handed to routes by dependency injection (one per app, none global)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from sessionmem_core.env import ProxySettings
from sessionmem_core.store import ConversationStore
from sessionmem_core.telemetry import MemoryTracer
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
