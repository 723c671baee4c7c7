"""The proxy's app: an RSGI application served by granian (``sessionmem_proxy.server``), built by one
factory that wires settings, the Valkey store, the authenticator and the tracer. Nothing is global;
tests build apps with their own parts.

RSGI rather than ASGI: it hands a request and its answer across from granian's threads with a fraction
of ASGI's work (docs/benchmarks.md). Its path arrives percent-decoded (ids are checked on it by
``sessionmem_core.ids``); its streamed answers have no flow control, so nothing is
streamed (exports are paged).
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from granian.rsgi import HTTPProtocol, Scope
from opentelemetry.trace import TracerProvider
from pydantic import ValidationError

from sessionmem_core import api
from sessionmem_core.capability import Keyring
from sessionmem_core.env import ProxySettings
from sessionmem_core.errors import InvalidRequest, Overloaded, SessionMemError
from sessionmem_infra.heap import settle_heap
from sessionmem_infra.serving import CONNECTION_CLOSE, BodyMeter, RequestLimits, closes_connection
from sessionmem_infra.telemetry import MemoryTracer, tracer_provider_from_env
from sessionmem_proxy.context import ProxyContext, identify
from sessionmem_proxy.identity import AgentIdentity, Authenticator, DevAuthenticator
from sessionmem_proxy.keying import KeyResolver
from sessionmem_proxy.kubeapi import KubeAPI
from sessionmem_proxy.limits import InFlight
from sessionmem_proxy.membership import KubeRegistryMembership, Membership
from sessionmem_proxy.metrics import ProxyMetrics
from sessionmem_proxy.params import RawRequest, parse
from sessionmem_proxy.quotas import DefaultLimits, KubeAgentLimits, LimitSource, QuotaLimits, Quotas
from sessionmem_proxy.rbac import AdminAuthorizer, DevAdminAuthorizer, KubeAdminAuthorizer
from sessionmem_proxy.redaction import Redaction
from sessionmem_proxy.replies import Reply, error_reply, internal_error_reply
from sessionmem_proxy.routes import NotAllowedHere, Route, RouteTable
from sessionmem_proxy.sealing import sealer_from_settings
from sessionmem_proxy.store import ConversationStore, UsageLedger
from sessionmem_proxy.tokenreview import TokenReviewAuthenticator
from sessionmem_proxy.valkey_client import connect

_LOG = logging.getLogger("sessionmem.proxy")
# A young collection every 7,000 net allocations instead of CPython's 700: each one traverses what the
# requests in flight hold besides the new objects, so its cost per request falls with its frequency,
# while cyclic garbage still waits only a few dozen requests (docs/benchmarks.md).
GC_THRESHOLDS = (7000, 10, 10)


class ProxyApp:
    """Serves every request from the route table, within the serving limits; closes what it owns when
    granian stops the worker (``__rsgi_del__``, or ``aclose``)."""

    def __init__(
        self,
        ctx: ProxyContext,
        limits: RequestLimits,
        closers: list[Callable[[], Awaitable[None]]],
        table: RouteTable | None = None,
    ) -> None:
        self.ctx = ctx
        self.limits = limits
        self.table = table or RouteTable()
        self.in_flight = InFlight(limits.serving.max_connections)
        self._closers = closers

    async def __rsgi__(self, scope: Scope, proto: HTTPProtocol) -> None:
        # An HTTP request (granian serves no websockets here), served in this coroutine rather than in a
        # method of its own: one coroutine less per request.
        try:
            headers = self.limits.check_head(scope)
            route, path_values = self.table.match(scope.method, scope.path)
        except SessionMemError as exc:
            _respond(proto, _typed(exc))
            return
        _respond(proto, await self._serve(route, path_values, scope.query_string, headers, proto))

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        # A worker process's loop has stopped by now; an embedded server's loop still runs, and whoever
        # embeds the app closes it.
        if not loop.is_running():
            loop.run_until_complete(self.aclose())

    async def aclose(self) -> None:
        closers, self._closers = self._closers, []
        for close in closers:
            await close()

    async def _serve(
        self,
        route: Route[Any],
        path_values: Mapping[str, str],
        query: str,
        headers: dict[str, str],
        proto: HTTPProtocol,
    ) -> Reply:
        """The reply of one routed request; every failure becomes a typed answer here.

        The caller is verified, and its body read, before the request takes one of the worker's slots
        (``InFlight``): a client that sends a head and holds back its body, or one without credentials,
        holds a connection (granian's, bounded per worker) but never a slot other agents need. A body is
        read only from a verified agent within its transfer quota (fail-closed: no body is read, parsed
        or validated for anyone else)."""
        try:
            values = parse(route.params, RawRequest(path_values, dict(api.parse_query(query)), headers))
            if route.request is None:
                if hasattr(values, "verified"):  # an operation of an agent: verified before it takes a slot
                    values.verified = await self._verify(route, headers, upload=False)
                return await self._in_slot(route, values, None)
            try:
                uploader = await self._verify(route, headers, upload=True)
            except SessionMemError as exc:
                # The body stays unread: the connection cannot carry another request.
                refused = _typed(exc)
                refused.headers = [*refused.headers, CONNECTION_CLOSE]
                return refused
            values.verified = uploader  # a route with a body acts on one conversation
            meter = BodyMeter()
            try:
                raw = await self.limits.read_body(
                    proto,
                    headers.get("content-length"),
                    "transfer-encoding" in headers,
                    meter,
                    expect_continue=headers.get("expect", "").lower() == "100-continue",
                )
                return await self._in_slot(route, values, raw)
            finally:
                # Charged once answered, so the body's own size never refuses it; the agent's next request
                # finds its bucket in debt if this one took more than was left. Refused bodies (413, 408,
                # 400) count too: what was read and dropped cost the same.
                self.ctx.quotas.charge(uploader.owner, meter.received)
        except SessionMemError as exc:
            return _typed(exc)
        except Exception as exc:
            _LOG.exception("unhandled error")
            return internal_error_reply(exc)

    async def _in_slot(self, route: Route[Any], values: Any, raw: bytes | None) -> Reply:
        """The operation, run in one of the worker's slots (a 503 when all are taken); ``raw``: the body
        already read, validated here."""
        if route.counted and not self.in_flight.enter():
            return error_reply(Overloaded("this worker is at its request limit; retry"))
        try:
            if raw is None or route.request is None:
                return await route.handler(self.ctx, values, None)
            try:
                body = route.request.model_validate_json(raw)
            except ValidationError as exc:
                raise InvalidRequest(_problems(exc)) from exc
            return await route.handler(self.ctx, values, body)
        finally:
            if route.counted:
                self.in_flight.leave()

    async def _verify(self, route: Route[Any], headers: Mapping[str, str], upload: bool) -> AgentIdentity:
        """The calling agent, verified before its request takes a slot; for a route with a body
        (``upload``) also its transfer quota, checked before the body is read: a stranger is refused
        (401/403, the connection closed) and an agent whose bucket is in debt gets its 429, both without
        the proxy reading or parsing what they send. The refusal is observed as the operation's outcome,
        as the operation would have."""
        started = time.perf_counter()
        try:
            identity = await identify(self.ctx, headers.get("authorization"))
            if upload:
                await self.ctx.quotas.admit_upload(identity.owner)
        except SessionMemError as exc:
            self.ctx.metrics.observe(route.op, exc.error_type, (time.perf_counter() - started) * 1000.0)
            raise
        return identity

    def openapi(self) -> dict[str, Any]:
        from sessionmem_proxy.openapi import document

        return document(self.table)


def _openapi_document() -> bytes:
    """The committed form of the proxy's OpenAPI document; its generator is imported on first use only
    (a worker that is never asked for it does not load pydantic's JSON schema machinery)."""
    from sessionmem_proxy.openapi import document_bytes

    return document_bytes()


def _typed(error: SessionMemError) -> Reply:
    if isinstance(error, NotAllowedHere):
        return error_reply(error, [("allow", error.allow)])
    return error_reply(error)


def _problems(exc: ValidationError) -> str:
    return (
        "; ".join(
            f"body.{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg', 'invalid')}"
            for err in exc.errors()[:5]
        )
        or "invalid body"
    )


def _respond(proto: HTTPProtocol, reply: Reply) -> None:
    headers = reply.headers
    if closes_connection(reply.status):
        headers = [*headers, CONNECTION_CLOSE]
    proto.response_bytes(reply.status, headers, reply.body)


def create_app(
    settings: ProxySettings | None = None,
    *,
    store: ConversationStore | None = None,
    authenticator: Authenticator | None = None,
    membership: Membership | None = None,
    tracer_provider: TracerProvider | None = None,
) -> ProxyApp:
    settings = settings or ProxySettings.from_env()
    closers: list[Callable[[], Awaitable[None]]] = []
    if store is None:
        owned_client = connect(settings.valkey_url, settings.valkey_timeout_seconds)
        sealer, close_keys = sealer_from_settings(settings, KubeAPI.from_settings)
        store = ConversationStore(owned_client, UsageLedger(owned_client), sealer)
        closers.append(owned_client.aclose)
        if close_keys is not None:
            closers.append(close_keys)
    default_limits = QuotaLimits.defaults(settings)
    limits: LimitSource = DefaultLimits(default_limits)
    admin: AdminAuthorizer | None = None
    if authenticator is None and settings.auth_mode == "dev":
        authenticator = DevAuthenticator()
        admin = DevAdminAuthorizer()
    elif authenticator is None:
        kube = KubeAPI.from_settings(settings)
        kube_http = kube.client()
        closers.append(kube_http.aclose)
        authenticator = TokenReviewAuthenticator(kube_http, kube, settings.audience)
        membership = membership or KubeRegistryMembership(kube_http, kube.bearer, settings.membership_cache_seconds)
        limits = KubeAgentLimits(kube_http, kube.bearer, default_limits, settings.membership_cache_seconds)
        admin = KubeAdminAuthorizer(kube_http, kube, settings.audience)
    closers.insert(0, authenticator.aclose)
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
        quotas=Quotas(limits, store.ledger, rate_share=settings.quota_rate_share),
        openapi=_openapi_document,
        admin=admin,
    )
    return ProxyApp(ctx, RequestLimits(settings.limits), closers)


def app_from_env() -> ProxyApp:
    """The factory each granian worker calls: the app from the environment's settings. The worker's heap
    is then settled (``sessionmem_infra.heap``): the app is all it keeps for the rest of its life."""
    app = create_app(ProxySettings.from_env())
    settle_heap(GC_THRESHOLDS)
    return app
