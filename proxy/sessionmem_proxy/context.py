"""The proxy's parts, handed to every route handler (one per app, none global)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType

from sessionmem_core.env import ProxySettings
from sessionmem_core.errors import BackendUnavailable, SessionMemError
from sessionmem_core.ids import ConversationId, parse_conversation_id
from sessionmem_core.keys import Scope
from sessionmem_infra.backend_state import BackendState, cause_of
from sessionmem_infra.telemetry import MemorySpan, MemoryTracer
from sessionmem_proxy.identity import AgentIdentity, Authenticator, bearer_token
from sessionmem_proxy.keying import KeyResolver
from sessionmem_proxy.metrics import ProxyMetrics
from sessionmem_proxy.quotas import QuotaLimits, Quotas
from sessionmem_proxy.rbac import AdminAuthorizer
from sessionmem_proxy.redaction import Redaction
from sessionmem_proxy.store import ConversationStore


@dataclass
class ProxyContext:
    settings: ProxySettings
    store: ConversationStore
    authenticator: Authenticator
    keys: KeyResolver
    redaction: Redaction
    tracer: MemoryTracer
    metrics: ProxyMetrics
    quotas: Quotas
    # The proxy's OpenAPI document (generated from the route table, on first use).
    openapi: Callable[[], bytes]
    admin: AdminAuthorizer | None = None
    # Valkey's state, logged when it changes (down with the cause, up), from readiness and every operation.
    backend: BackendState = field(init=False)

    def __post_init__(self) -> None:
        self.backend = BackendState(_LOG, "memory backend (Valkey)", self.settings.valkey_url)


_LOG = logging.getLogger("sessionmem.proxy")


# The key, among a request's parsed parameters, of the identity the app verified before reading the body
# (sessionmem_proxy.app): the operation then uses it instead of verifying the same token again.
VERIFIED_IDENTITY = "verified_identity"


def identify(ctx: ProxyContext, authorization: str | None) -> Awaitable[AgentIdentity]:
    """The caller's verified identity, to await (a malformed Authorization raises at once). The
    authenticator's own coroutine, not one around it: this runs on every request."""
    return ctx.authenticator.authenticate(bearer_token(authorization))


@dataclass(slots=True)
class Operation:
    """What one admitted operation works with: its span, the verified caller, the conversation (its id
    parsed once), the key built from both, the scope in effect and the caller's limits (which a write
    hands the store)."""

    span: MemorySpan
    identity: AgentIdentity
    conversation: ConversationId
    key: str
    scope: str
    limits: QuotaLimits


class conversation_operation:  # noqa: N801 - used like the function-style context manager it replaced
    """The one admission step of an operation on one conversation, the same way for every route: its
    ``memory.<op>`` span and metrics, the id parsed (once), the caller verified, the caller's limits
    looked up (once), the key resolved from the verified identity, and the quotas admitted.

    ``async with conversation_operation(...) as operation``. A class rather than a generator-based context
    manager: it runs twice per agent turn, and the generator machinery cost more than the bookkeeping."""

    __slots__ = ("_args", "_ctx", "_identity", "_op", "_span_cm", "_started")

    def __init__(
        self,
        ctx: ProxyContext,
        op: str,
        conversation_id: str,
        scope: Scope,
        authorization: str | None,
        capability: str | None,
        traceparent: str | None,
        identity: AgentIdentity | None = None,
    ) -> None:
        """``identity``: the caller, when already verified from ``authorization`` in this request."""
        self._ctx = ctx
        self._op = op
        self._identity = identity
        self._args = (conversation_id, scope, authorization, capability, traceparent)
        self._span_cm: AbstractContextManager[MemorySpan] | None = None
        self._started = 0.0

    async def __aenter__(self) -> Operation:
        ctx = self._ctx
        conversation_id, scope, authorization, capability, traceparent = self._args
        self._started = time.perf_counter()
        self._span_cm = ctx.tracer.span(self._op, conversation_id, traceparent)
        span = self._span_cm.__enter__()
        try:
            conversation = parse_conversation_id(conversation_id)
            identity = self._identity or await identify(ctx, authorization)
            owner = identity.owner
            limits = await ctx.quotas.policy_of(owner)
            key, scope_used = await ctx.keys.resolve(identity, scope, conversation, capability, limits.per_user)
            await ctx.quotas.admit(self._op, owner, key, limits)
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        span.scope = scope_used
        return Operation(span, identity, conversation, key, scope_used, limits)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        outcome = "internal" if exc is not None else "ok"
        if exc is None:
            if self._ctx.backend.is_down:
                self._ctx.backend.up()
        elif isinstance(exc, SessionMemError):
            outcome = exc.error_type
            observe_backend(self._ctx, exc)
        try:
            if self._span_cm is not None:
                self._span_cm.__exit__(exc_type, exc, tb)
        finally:
            self._span_cm = None
            self._ctx.metrics.observe(self._op, outcome, (time.perf_counter() - self._started) * 1000.0)


def observe_backend(ctx: ProxyContext, exc: BaseException | None) -> None:
    """Record what a call to Valkey says about its state: a BackendUnavailable is down (with its cause),
    no error is up; any other error says nothing about the backend."""
    if exc is None:
        ctx.backend.up()
    elif isinstance(exc, BackendUnavailable):
        ctx.backend.down(cause_of(exc))
