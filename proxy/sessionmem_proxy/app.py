"""The proxy's app: an RSGI application served by granian (``sessionmem_proxy.server``), built by one
factory that wires settings, the Valkey store, the authenticator and the tracer. Nothing is global;
tests build apps with their own parts.

RSGI rather than ASGI: it hands a request and its answer across from granian's threads with a fraction
of ASGI's work (docs/benchmarks.md). Its path arrives percent-decoded (ids are checked on it by
``sessionmem_core.keys``); its streamed answers have no flow control, so nothing is
streamed (exports are paged).
"""

from __future__ import annotations

import pathlib
from collections.abc import Awaitable, Callable

from opentelemetry.trace import TracerProvider

from sessionmem_core.capability import Keyring
from sessionmem_core.env import ProxySettings
from sessionmem_infra.heap import settle_heap
from sessionmem_infra.serving import (
    RequestLimits,
)
from sessionmem_infra.telemetry import MemoryTracer, ProxyMetrics, tracer_provider_from_env
from sessionmem_proxy.admission import (
    Authenticator,
    DefaultLimits,
    DevAuthenticator,
    KeyResolver,
    KubeAgentLimits,
    LimitSource,
    ProxyContext,
    QuotaLimits,
    Quotas,
)
from sessionmem_proxy.kubeapi import KubeAPI
from sessionmem_proxy.membership import KubeRegistryMembership, Membership
from sessionmem_proxy.rbac import AdminAuthorizer, DevAdminAuthorizer, KubeAdminAuthorizer
from sessionmem_proxy.redaction import Redaction
from sessionmem_proxy.routes import ProxyApp
from sessionmem_proxy.sealing import sealer_from_settings
from sessionmem_proxy.store import ConversationStore, UsageLedger
from sessionmem_proxy.tokenreview import TokenReviewAuthenticator
from sessionmem_proxy.valkey_client import connect

# A young collection every 7,000 net allocations instead of CPython's 700: each one traverses what the
# requests in flight hold besides the new objects, so its cost per request falls with its frequency,
# while cyclic garbage still waits only a few dozen requests (docs/benchmarks.md).
GC_THRESHOLDS = (7000, 10, 10)


def _openapi_document() -> bytes:
    """The committed form of the proxy's OpenAPI document; its generator is imported on first use only
    (a worker that is never asked for it does not load pydantic's JSON schema machinery)."""
    from sessionmem_proxy.openapi import document_bytes

    return document_bytes()


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


# --- The worker's count of requests in flight (the serving limits of one request are
# ``sessionmem_infra.serving.RequestLimits``; docs/limits.md says which layer enforces which limit).
