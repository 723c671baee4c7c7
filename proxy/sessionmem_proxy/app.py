"""The proxy's FastAPI app factory: one place that wires settings, the Valkey store, the authenticator
and the tracer into the routes. Nothing is global; tests build apps with their own parts."""

from __future__ import annotations

import logging
import pathlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from opentelemetry.trace import TracerProvider
from starlette.exceptions import HTTPException as StarletteHTTPException

from sessionmem_core import api, env, wire
from sessionmem_core.capability import Keyring
from sessionmem_core.env import ProxySettings
from sessionmem_core.errors import InvalidRequest, SessionMemError, error_body
from sessionmem_core.ids import validate_conversation_id
from sessionmem_core.keys import Scope
from sessionmem_core.store import ConversationStore, UsageLedger, search_entries
from sessionmem_core.telemetry import MemoryTracer, tracer_provider_from_env
from sessionmem_core.valkey_client import connect
from sessionmem_proxy.context import Ctx, ProxyContext, conversation_operation
from sessionmem_proxy.hot import (
    HotPath,
    append_conversation,
    as_response,
    internal_error_body,
    memory_json,
    new_entries,
    read_conversation,
)
from sessionmem_proxy.identity import Authenticator, DevAuthenticator
from sessionmem_proxy.keying import KeyResolver
from sessionmem_proxy.kubeapi import KubeAPI
from sessionmem_proxy.lifecycle import install_lifecycle_routes
from sessionmem_proxy.limits import BodySizeLimit
from sessionmem_proxy.membership import KubeRegistryMembership, Membership
from sessionmem_proxy.metrics import ProxyMetrics
from sessionmem_proxy.params import (
    AuthHeader,
    CapabilityHeader,
    CapQuery,
    ConversationIdPath,
    RedactQuery,
    ScopeQuery,
    TraceHeader,
    TtlQuery,
)
from sessionmem_proxy.quotas import DefaultLimits, KubeAgentLimits, LimitSource, QuotaLimits, Quotas
from sessionmem_proxy.redaction import Redaction
from sessionmem_proxy.tokenreview import TokenReviewAuthenticator

JSON = "application/json"
_LOG = logging.getLogger("sessionmem.proxy")


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": wire.ErrorResponse, "description": text}
    for status, text in {
        400: "Bad conversation id or body",
        401: "Missing, invalid or expired token",
        403: "Token is not an agent identity",
        413: "Body over 1 MiB",
        429: "Over the agent's request rate (Retry-After says when to retry)",
        503: "Backend or identity service unavailable",
        507: "The agent's stored conversations or bytes are at its quota",
    }.items()
}


def _json(body: bytes, status: int = 200) -> Response:
    return Response(content=body, status_code=status, media_type=JSON)


def create_app(
    settings: ProxySettings | None = None,
    *,
    store: ConversationStore | None = None,
    authenticator: Authenticator | None = None,
    membership: Membership | None = None,
    tracer_provider: TracerProvider | None = None,
) -> FastAPI:
    settings = settings or ProxySettings.from_env()
    owned_client = None
    if store is None:
        owned_client = connect(settings.valkey_url, settings.valkey_timeout_seconds)
        store = ConversationStore(owned_client, UsageLedger(owned_client))
    default_limits = QuotaLimits.defaults(settings)
    limits: LimitSource = DefaultLimits(default_limits)
    kube_http = None
    if authenticator is None and settings.auth_mode == "dev":
        authenticator = DevAuthenticator()
    elif authenticator is None:
        api = KubeAPI.from_settings(settings)
        kube_http = api.client()
        authenticator = TokenReviewAuthenticator(kube_http, api, settings.audience)
        membership = membership or KubeRegistryMembership(kube_http, api.bearer, settings.membership_cache_seconds)
        limits = KubeAgentLimits(kube_http, api.bearer, default_limits, settings.membership_cache_seconds)
    keyring = (
        Keyring.load(
            pathlib.Path(settings.capability_key_file),
            pathlib.Path(settings.capability_bucket_key_file) if settings.capability_bucket_key_file else None,
            settings.capability_max_lifetime_seconds,
        )
        if settings.capability_key_file
        else None
    )
    ctx = ProxyContext(
        settings=settings,
        store=store,
        authenticator=authenticator,
        keys=KeyResolver(membership, keyring),
        redaction=Redaction.from_json(settings.redact_patterns),
        tracer=MemoryTracer(tracer_provider or tracer_provider_from_env("sessionmem-proxy"), "proxy"),
        metrics=ProxyMetrics(),
        quotas=Quotas(limits, store.ledger),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await ctx.authenticator.aclose()
            if kube_http is not None:
                await kube_http.aclose()
            if owned_client is not None:
                await owned_client.aclose()

    app = FastAPI(
        title="sessionmem state-layer proxy",
        version="1",
        description="Conversation memory for agents: authenticated, keyed server-side, stored in Valkey.",
        lifespan=lifespan,
        responses=_ERRORS,
    )
    app.state.ctx = ctx
    # The two operations on every agent turn skip the framework's routing and parameter solving; the
    # routes below still serve (and document) them with the same functions.
    app.add_middleware(HotPath, ctx=ctx)
    app.add_middleware(BodySizeLimit, max_bytes=env.MAX_BODY_BYTES)
    _install_error_handlers(app)
    _install_routes(app)
    install_lifecycle_routes(app)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SessionMemError)
    async def on_sessionmem_error(_: Request, exc: SessionMemError) -> Response:
        response = _json(exc.body(), exc.status)
        response.raw_headers.extend(exc.headers())
        return response

    @app.exception_handler(Exception)
    async def on_unexpected(_: Request, exc: Exception) -> Response:
        _LOG.exception("unhandled error")
        return _json(internal_error_body(exc), 500)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg', 'invalid')}" for err in exc.errors()[:5]
        )
        return _json(error_body(InvalidRequest.error_type, problems or "invalid request"), 400)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            # The router's path pattern cannot match some bad ids (a newline, say); the id rule names them.
            try:
                conversation_id = api.memory_route(request.method, request.scope["path"])[1]
                if conversation_id is not None:
                    validate_conversation_id(conversation_id)
            except SessionMemError as error:
                return _json(error.body(), error.status)
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        response = _json(error_body(kind, str(exc.detail)), exc.status_code)
        response.headers.update(getattr(exc, "headers", None) or {})  # e.g. Allow on a 405
        return response


def _install_routes(app: FastAPI) -> None:
    prefix = api.API_PREFIX

    @app.get("/healthz", response_model=wire.Health, tags=["health"])
    async def healthz() -> Response:
        return _json(b'{"status":"ok"}')

    @app.get("/readyz", response_model=wire.Health, tags=["health"])
    async def readyz(ctx: Ctx) -> Response:
        await ctx.store.ping()
        return _json(b'{"status":"ready"}')

    @app.get("/metrics", response_class=PlainTextResponse, tags=["health"])
    async def metrics(ctx: Ctx) -> PlainTextResponse:
        return PlainTextResponse(ctx.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get(
        f"{prefix}/conversations/{{conversation_id:path}}/entries",
        response_model=wire.History,
        tags=["memory"],
        summary="Read the last entries of a conversation",
    )
    async def read_entries(
        ctx: Ctx,
        conversation_id: ConversationIdPath,
        limit: Annotated[int, Query(ge=0, le=env.MAX_READ_LIMIT)] = env.DEFAULT_REPLAY_MESSAGES,
        summary: Annotated[bool, Query(description="Also return the rolling summary of older turns")] = False,
        scope: ScopeQuery = Scope.SESSION,
        authorization: AuthHeader = None,
        traceparent: TraceHeader = None,
        x_sessionmem_user_capability: CapabilityHeader = None,
    ) -> Response:
        return as_response(
            await read_conversation(
                ctx, conversation_id, limit, summary, scope, authorization, x_sessionmem_user_capability, traceparent
            )
        )

    @app.post(
        f"{prefix}/conversations/{{conversation_id:path}}/entries",
        response_model=wire.AppendResponse,
        tags=["memory"],
        summary="Append a batch (normally one user/assistant exchange) atomically",
    )
    async def append_entries(
        ctx: Ctx,
        conversation_id: ConversationIdPath,
        body: wire.AppendRequest,
        scope: ScopeQuery = Scope.SESSION,
        cap: CapQuery = env.DEFAULT_CAP,
        ttl_seconds: TtlQuery = env.DEFAULT_TTL_SECONDS,
        redact: RedactQuery = "",
        authorization: AuthHeader = None,
        traceparent: TraceHeader = None,
        x_sessionmem_user_capability: CapabilityHeader = None,
    ) -> Response:
        return as_response(
            await append_conversation(
                ctx,
                conversation_id,
                body.entries,
                scope,
                cap,
                ttl_seconds,
                redact,
                authorization,
                x_sessionmem_user_capability,
                traceparent,
            )
        )

    @app.get(
        f"{prefix}/conversations/{{conversation_id:path}}/search",
        response_model=wire.SearchResponse,
        tags=["memory"],
        summary="Keyword search within one conversation",
    )
    async def search(
        ctx: Ctx,
        conversation_id: ConversationIdPath,
        q: Annotated[str, Query(min_length=1, max_length=1024)],
        limit: Annotated[int, Query(ge=1, le=100)] = 10,
        scope: ScopeQuery = Scope.SESSION,
        authorization: AuthHeader = None,
        traceparent: TraceHeader = None,
        x_sessionmem_user_capability: CapabilityHeader = None,
    ) -> Response:
        async with conversation_operation(
            ctx, "search", conversation_id, scope, authorization, x_sessionmem_user_capability, traceparent
        ) as operation:
            result = await ctx.store.read_all(operation.key)
            matches = search_entries(result.raw_entries, q, limit)
            operation.span.entries, operation.span.version = len(matches), result.version
            scope_used = operation.scope
            response = wire.SearchResponse(
                conversationId=conversation_id,
                scope=scope_used,
                query=q,
                matches=[wire.Entry.model_validate(m) for m in matches],
            )
            return memory_json(
                response.model_dump_json(by_alias=True).encode(), scope_used, len(matches), result.version
            )

    @app.put(
        f"{prefix}/conversations/{{conversation_id:path}}",
        response_model=wire.ReplaceResponse,
        tags=["memory"],
        summary="Replace (seed) a conversation, conditional on its version",
        responses={412: {"model": wire.ErrorResponse, "description": "If-Match does not match the version"}},
    )
    async def replace(
        ctx: Ctx,
        conversation_id: ConversationIdPath,
        body: wire.ReplaceRequest,
        if_match: Annotated[
            str | None, Header(description="Expected version (as returned by a read); '*' or absent: any")
        ] = None,
        scope: ScopeQuery = Scope.SESSION,
        cap: CapQuery = env.DEFAULT_CAP,
        ttl_seconds: TtlQuery = env.DEFAULT_TTL_SECONDS,
        redact: RedactQuery = "",
        authorization: AuthHeader = None,
        traceparent: TraceHeader = None,
        x_sessionmem_user_capability: CapabilityHeader = None,
    ) -> Response:
        expected = _parse_if_match(if_match)
        async with conversation_operation(
            ctx, "replace", conversation_id, scope, authorization, x_sessionmem_user_capability, traceparent
        ) as operation:
            result = await ctx.store.replace(
                operation.key,
                await new_entries(ctx, body.entries, redact),
                author=operation.identity.owner.author,
                expected_version=expected,
                cap=cap,
                ttl_seconds=ttl_seconds,
            )
            operation.span.entries, operation.span.version = result.stored, result.version
            scope_used = operation.scope
            response = wire.ReplaceResponse(version=result.version, stored=result.stored, scope=scope_used)
            return memory_json(response.model_dump_json().encode(), scope_used, result.stored, result.version)

    @app.delete(
        f"{prefix}/conversations/{{conversation_id:path}}",
        response_model=wire.DeleteResponse,
        tags=["memory"],
        summary="Erase a conversation",
    )
    async def delete(
        ctx: Ctx,
        conversation_id: ConversationIdPath,
        scope: ScopeQuery = Scope.SESSION,
        authorization: AuthHeader = None,
        traceparent: TraceHeader = None,
        x_sessionmem_user_capability: CapabilityHeader = None,
    ) -> Response:
        async with conversation_operation(
            ctx, "delete", conversation_id, scope, authorization, x_sessionmem_user_capability, traceparent
        ) as operation:
            removed = await ctx.store.delete(operation.key)
            operation.span.entries = removed
            scope_used = operation.scope
            response = wire.DeleteResponse(deleted=removed > 0, entries=removed, scope=scope_used)
            return memory_json(response.model_dump_json().encode(), scope_used, removed, None)


def _parse_if_match(if_match: str | None) -> int | None:
    if if_match is None or if_match.strip() in ("", "*"):
        return None
    value = if_match.strip().removeprefix("W/").strip('"')
    if not value.isdigit():
        raise InvalidRequest("If-Match must be a version number, or '*'")
    return int(value)
