"""The one admission step of the proxy: who is calling, which key their request maps to, and whether
their limits let it run. Every operation on a conversation enters here once (``conversation_operation``)
and gets an ``Operation``: its span, the verified caller, the conversation id parsed into its type, the
key, the scope in effect and the caller's limits, which a write then hands the store as arguments.

Also the proxy's parts, handed to every handler (``ProxyContext``: one per app, none global). The key
layouts themselves are the contract's (``sessionmem_core.keys``); this module only picks which one a
verified caller's request gets (``KeyResolver``)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import httpx
import orjson

from sessionmem_core import api, env, kube
from sessionmem_core.capability import Keyring, user_bucket, verify_capability
from sessionmem_core.devauth import DEV_TOKEN_PREFIX
from sessionmem_core.env import ProxySettings
from sessionmem_core.errors import (
    AuthUnavailable,
    BackendUnavailable,
    Forbidden,
    InvalidRequest,
    RateLimited,
    SessionMemError,
    Unauthenticated,
    UserCapabilityRequired,
)
from sessionmem_core.keys import (
    ConversationId,
    Owner,
    Scope,
    parse_conversation_id,
    per_user_prefix,
    session_prefix,
    shared_prefix,
)
from sessionmem_infra.backend_state import BackendState, cause_of
from sessionmem_infra.serving import TokenBucket
from sessionmem_infra.telemetry import MemorySpan, MemoryTracer, ProxyMetrics
from sessionmem_proxy.membership import Membership
from sessionmem_proxy.rbac import AdminAuthorizer
from sessionmem_proxy.redaction import Redaction
from sessionmem_proxy.store import ConversationStore, UsageLedger, refusal


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


# --- Who is calling: the verified identity every key is built from, and the authenticator interface.
#
# The proxy never takes an identity from a request body or a plain header: an authenticator turns the
# bearer credential into an ``AgentIdentity`` or raises a typed 401/403/503.


@dataclass(frozen=True, slots=True)
class AgentIdentity:
    owner: Owner
    # The AgentRegistry this agent is a verified member of, if any: only then may it use shared scope.
    registry: str | None = None


class Authenticator(Protocol):
    async def authenticate(self, bearer_token: str | None) -> AgentIdentity: ...

    async def aclose(self) -> None: ...


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("Authorization must be 'Bearer <token>'")
    return token.strip()


class DevAuthenticator:
    """Trusts ``dev:<namespace>/<agent>[@<registry>]`` tokens. For local stacks and tests without a
    cluster; it is never the default and the chart never enables it.

    Answers are remembered (a bounded number), as the TokenReview authenticator remembers its verified
    identities, so the dev mode costs per request what production does and benchmarks in it stay fair."""

    _REMEMBERED = 1024

    def __init__(self) -> None:
        self._known: dict[str, AgentIdentity] = {}

    async def authenticate(self, bearer_token: str | None) -> AgentIdentity:
        if bearer_token is None:
            raise Unauthenticated("missing bearer token")
        known = self._known.get(bearer_token)
        if known is not None:
            return known
        identity = self._parse(bearer_token)
        if len(self._known) >= self._REMEMBERED:
            self._known.clear()  # dev tokens are few; a flood of distinct ones just starts over
        self._known[bearer_token] = identity
        return identity

    @staticmethod
    def _parse(bearer_token: str) -> AgentIdentity:
        if not bearer_token.startswith(DEV_TOKEN_PREFIX):
            raise Unauthenticated("not a dev token")
        subject, _, registry = bearer_token[len(DEV_TOKEN_PREFIX) :].partition("@")
        namespace, slash, agent = subject.partition("/")
        if not slash:
            raise Forbidden("dev token must name <namespace>/<agent>")
        try:
            owner = Owner(namespace=namespace, agent=agent)
        except InvalidRequest as exc:
            raise Forbidden(f"dev token is not an agent identity: {exc.message}") from exc
        return AgentIdentity(owner=owner, registry=registry or None)

    async def aclose(self) -> None:
        return None


class FixedIdentityAuthenticator:
    """The pod's own identity, for a launcher that talks to Valkey directly (no proxy in between):
    there is no other caller to tell apart, so nothing in the request can change who it is."""

    def __init__(self, identity: AgentIdentity) -> None:
        self._identity = identity

    async def authenticate(self, bearer_token: str | None) -> AgentIdentity:
        return self._identity

    async def aclose(self) -> None:
        return None


# --- Every Valkey key the proxy uses, built here and nowhere else in the proxy: which key a verified
# caller's request maps to (the only place the proxy picks a layout), the spaces an administrator names,
# the patterns that list a space, and the accounting keys a conversation counts against. The layouts
# themselves are the contract's (``sessionmem_core.keys``).


def _refuse_per_user_without_user(identity: AgentIdentity, per_user: bool | None) -> None:
    """A perUser agent (so says its AgentDeployment: the cluster's truth, not a header of the pod) has no
    memory outside its users' buckets: without a capability it gets 401, never a shared bucket. Fail
    closed: when the AgentDeployment could not be read (``per_user`` None), a request without a user is 503."""
    if per_user is None:
        raise AuthUnavailable(f"cannot tell whether {identity.owner.author} keeps memory per user")
    if per_user:
        raise UserCapabilityRequired(
            f"{identity.owner.author} keeps memory per user: send the {api.USER_CAPABILITY_HEADER} header"
        )


class KeyResolver:
    def __init__(self, membership: Membership | None = None, keyring: Keyring | None = None) -> None:
        self._membership = membership
        self._keyring = keyring

    async def resolve_prefix(
        self, identity: AgentIdentity, requested: Scope, user_capability: str | None, per_user: bool | None
    ) -> tuple[str, str]:
        """(key prefix, scope in effect) of the space a request works in; ``per_user``: whether the agent
        keeps memory per user, as its limits say (None: unknown).

        - A user capability selects the user's private bucket (perUser is private scope only). Without
          a configured key the proxy cannot verify one, so it refuses it (fail closed).
        - Shared scope needs verified registry membership; a non-member keeps its private layout, never
          a rootless shared key. Membership that cannot be resolved fails closed (503).
        """
        if user_capability is not None:
            return self.user_prefix(identity, user_capability), Scope.SESSION.value
        _refuse_per_user_without_user(identity, per_user)
        if requested is Scope.SHARED:
            registry = identity.registry
            if registry is None and self._membership is not None:
                registry = await self._membership.registry_of(identity.owner)
            if registry:
                return shared_prefix(registry), Scope.SHARED.value
        return session_prefix(identity.owner), Scope.SESSION.value

    def bucket_prefix(self, owner: Owner, subject: str) -> str:
        """The prefix of one user's bucket with one agent, for an administrator who names the user."""
        if self._keyring is None:
            raise Forbidden("this proxy has no capability key: it keeps no per-user memory")
        return per_user_prefix(owner, user_bucket(self._keyring, owner, subject))

    def user_prefix(self, identity: AgentIdentity, user_capability: str | None) -> str:
        if user_capability is None:
            raise InvalidRequest("this operation needs the end user's capability")
        if self._keyring is None:
            raise Unauthenticated("this proxy has no capability key: per-user memory is not enabled")
        subject = verify_capability(self._keyring, user_capability, identity.owner)
        return per_user_prefix(identity.owner, user_bucket(self._keyring, identity.owner, subject))

    async def resolve(
        self,
        identity: AgentIdentity,
        requested: Scope,
        conversation: ConversationId,
        user_capability: str | None,
        per_user: bool | None,
    ) -> tuple[str, str]:
        """(key, scope in effect) for one conversation, whose id was parsed once, where the request was."""
        prefix, scope = await self.resolve_prefix(identity, requested, user_capability, per_user)
        return prefix + conversation, scope


# --- Per-agent quotas: stored conversations and bytes (507 when full), a request rate and a transfer rate
# (429).
#
# Limits are the chart's defaults (``SESSIONMEM_QUOTA_*``), overridden per agent by its AgentDeployment's
# ``spec.sessionMemory.quota`` {maxConversations, maxBytes, requestsPerSecond}, read from the API server and
# cached briefly (the registry membership's cache period). In dev auth mode there is no API server: the
# defaults apply to every agent.
#
# What is exact and what is approximate (docs/quotas.md):
#
# - Storage is counted per space by ``store.UsageLedger``: an agent's private conversations (perUser buckets
#   included), or a registry's shared ones (checked against the writing agent's limits). The conversation
#   count is exact: on a standalone Valkey the check, the write and its accounting are one script; on a
#   Cluster a write is first admitted by one atomic reservation, which counts a new conversation at once.
#   A write is refused only when the space is already at the byte limit (never because of its own size),
#   so on a Cluster a space ends at most one batch per concurrent writer over its byte quota. A
#   conversation that already exists may always be written when the count is full. Expired conversations
#   stop counting when their TTL passes.
# - The rate is a token bucket per agent in each proxy worker process, holding that worker's share of it:
#   the rate and burst divided by how many workers the Deployment runs at most (``rate_share``: replicas x
#   workers, the autoscaler's maximum when there is one), so an agent's rate holds across all of them. Every
#   operation costs one token.
# - The transfer rate is a second bucket per agent and worker, its share of the agent's bytes per second
#   (the burst never less than two maximal bodies, so any body can be sent), counted in bytes: an agent whose bucket is
#   in debt is refused before its body is read (the proxy neither reads nor parses what it sends); a body
#   is charged by its size once served, an answer by its size once built, an export page by its size, each
#   page answered once the bucket is out of debt (an export is paced, not refused). An agent whose bucket
#   is in debt is refused until it is not. At most ``STREAMS_PER_AGENT`` big answers of an agent (export
#   pages, searches, windows read apart from the script) are read at once in a worker. Without it, one
#   tenant exporting huge conversations in a loop takes the proxy's CPU from every other, and one reading
#   big windows on many connections takes every connection a worker reads them on (docs/benchmarks.md,
#   noisy neighbour).
# - A refusal costs the proxy about what serving a small read does, so an agent that asks again at once,
#   on many connections, would take a worker's CPU with refusals alone. So an agent refused again before
#   the ``Retry-After`` it was last given has passed is answered only once it has, holding that answer at
#   most ``REFUSAL_HOLD_SECONDS``, after the request left its slot (``Quotas.refusal``): a client that
#   keeps asking is answered about once a second per connection, one that waits as told never waits more.

# Operations that store something, and so are checked against the storage quota.
WRITES = frozenset(operation.op for operation in api.MEMORY_OPERATIONS if operation.writes)
# Operations paced by the transfer rate rather than refused by it (an export's pages wait for the bucket).
PACED = frozenset({"export"})
_REMEMBERED = 10_000
STREAMS_PER_AGENT = 2
# How many seconds of its transfer rate one CPU-second of work done for an agent alone (redaction) costs it.
CPU_SECOND_COST = 10.0
# The longest an agent's refusal is held before it is answered (``Quotas.refusal``).
REFUSAL_HOLD_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """What the cluster says of one agent's memory: its quotas, and whether it keeps memory per user
    (``spec.sessionMemory.perUser``; None when the AgentDeployment could not be read)."""

    max_conversations: int
    max_bytes: int
    requests_per_second: float
    burst: int
    per_user: bool | None = False
    bytes_per_second: float = float(env.DEFAULT_QUOTA_BYTES_PER_SECOND)

    @classmethod
    def defaults(cls, settings: ProxySettings) -> QuotaLimits:
        return cls(
            max_conversations=settings.quota_conversations,
            max_bytes=settings.quota_bytes,
            requests_per_second=settings.quota_requests_per_second,
            burst=settings.quota_burst,
            bytes_per_second=float(settings.quota_bytes_per_second),
        )

    @property
    def bytes_burst(self) -> float:
        """Twice the transfer rate, and never less than two maximal bodies: a slow agent can still send one."""
        return max(2.0 * self.bytes_per_second, 2.0 * env.MAX_BODY_BYTES)

    def overridden(self, quota: Any, per_user: bool = False) -> QuotaLimits:
        """These limits with an AgentDeployment's ``spec.sessionMemory.quota`` applied; a custom rate brings
        a burst of twice that rate (the defaults' ratio), never less than one request."""
        if not isinstance(quota, dict):
            return dataclasses.replace(self, per_user=per_user)
        rate = _positive(quota.get("requestsPerSecond"), self.requests_per_second)
        return QuotaLimits(
            max_conversations=int(_positive(quota.get("maxConversations"), self.max_conversations)),
            max_bytes=int(_positive(quota.get("maxBytes"), self.max_bytes)),
            requests_per_second=rate,
            burst=self.burst if rate == self.requests_per_second else max(1, math.ceil(2 * rate)),
            per_user=per_user,
            bytes_per_second=_positive(quota.get("bytesPerSecond"), self.bytes_per_second),
        )


def _positive(value: Any, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return default
    return float(value)


class LimitSource(Protocol):
    async def limits_of(self, owner: Owner) -> QuotaLimits: ...

    def cached(self, owner: Owner) -> QuotaLimits | None:
        """The agent's limits when known without waiting (most requests): no coroutine to run."""
        ...


class DefaultLimits:
    """The same limits for every agent (dev auth mode, or a proxy told nothing else)."""

    def __init__(self, limits: QuotaLimits) -> None:
        self._limits = limits

    async def limits_of(self, owner: Owner) -> QuotaLimits:
        return self._limits

    def cached(self, owner: Owner) -> QuotaLimits:
        return self._limits


class KubeAgentLimits:
    """Limits from each agent's AgentDeployment, cached ``cache_seconds``; one API call per agent at a time.

    An AgentDeployment that cannot be read (absent, no permission, API server down) means the defaults:
    quotas protect the other tenants, and a missing override must not lock an agent out."""

    def __init__(
        self, http: httpx.AsyncClient, bearer: Callable[[], str], defaults: QuotaLimits, cache_seconds: float
    ) -> None:
        self._http = http
        self._bearer = bearer
        self._defaults = defaults
        self._cache_seconds = cache_seconds
        self._known: dict[Owner, tuple[float, QuotaLimits]] = {}
        self._inflight: dict[Owner, asyncio.Future[QuotaLimits]] = {}
        self.api_calls = 0

    def cached(self, owner: Owner) -> QuotaLimits | None:
        known = self._known.get(owner)
        if known is not None and time.monotonic() - known[0] < self._cache_seconds:
            return known[1]
        return None

    async def limits_of(self, owner: Owner) -> QuotaLimits:
        known = self.cached(owner)
        if known is not None:
            return known
        pending = self._inflight.get(owner)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[QuotaLimits] = asyncio.get_running_loop().create_future()
        self._inflight[owner] = future
        try:
            limits = await self._fetch(owner)
            future.set_result(limits)
        finally:
            del self._inflight[owner]
            if not future.done():
                future.set_result(self._defaults)
        if len(self._known) >= _REMEMBERED:
            self._known.clear()
        self._known[owner] = (time.monotonic(), limits)
        return limits

    async def _fetch(self, owner: Owner) -> QuotaLimits:
        """The agent's limits. Quotas fail open (the defaults) when the AgentDeployment cannot be read; its
        perUser flag then reads None, and the key resolver fails closed on it (``KeyResolver``). An agent with no
        AgentDeployment (404) keeps no per-user memory."""
        path = f"/apis/{kube.GROUP}/{kube.VERSION}/namespaces/{owner.namespace}/{kube.AGENT_PLURAL}/{owner.agent}"
        self.api_calls += 1
        unknown = dataclasses.replace(self._defaults, per_user=None)
        try:
            response = await self._http.get(path, headers={"Authorization": f"Bearer {self._bearer()}"})
        except (httpx.HTTPError, OSError):
            return unknown
        if response.status_code == 404:
            return self._defaults
        if response.status_code != 200:
            return unknown
        try:
            memory = (orjson.loads(response.content).get("spec") or {}).get("sessionMemory") or {}
            quota, per_user = memory.get("quota"), memory.get("perUser") is True
        except (orjson.JSONDecodeError, AttributeError):
            return unknown
        return self._defaults.overridden(quota, per_user)


class Quotas:
    """``admit`` runs before every operation, once the caller and the key are known."""

    def __init__(
        self,
        limits: LimitSource,
        ledger: UsageLedger | None,
        clock: Callable[[], float] = time.monotonic,
        rate_share: int = 1,
    ) -> None:
        """``rate_share``: how many worker processes split every agent's rates (``env.QUOTA_RATE_SHARE``)."""
        self._limits = limits
        self._share = float(rate_share)
        self._ledger = ledger
        self._clock = clock
        self._buckets: dict[Owner, TokenBucket] = {}
        self._transfers: dict[Owner, TokenBucket] = {}
        self._streams: dict[Owner, int] = {}
        # When each agent refused here may ask again: the latest Retry-After it was given.
        self._refused_until: dict[Owner, float] = {}

    async def policy_of(self, owner: Owner) -> QuotaLimits:
        return self._limits.cached(owner) or await self._limits.limits_of(owner)

    async def admit(self, op: str, owner: Owner, key: str, limits: QuotaLimits | None = None) -> QuotaLimits:
        """Admit one operation of ``owner`` on ``key`` (429, 507 otherwise), and return the agent's limits,
        which a write then hands the store (``store.ConversationStore.append``). ``limits``: the agent's
        limits when the caller already looked them up (``policy_of``)."""
        if limits is None:
            limits = self._limits.cached(owner) or await self._limits.limits_of(owner)
        now = self._clock()
        self._take_token(owner, limits, now)
        if op in PACED:
            self._transfer_bucket(owner, limits, now)
        else:
            self._check_transfer(owner, limits, now)
        if op in WRITES and self._ledger is not None:
            await self._check_storage(limits, key)
        return limits

    async def admit_upload(self, owner: Owner) -> None:
        """Before a body is read: refused (429) while the agent's transfer bucket is in debt."""
        limits = self._limits.cached(owner) or await self._limits.limits_of(owner)
        self._check_transfer(owner, limits, self._clock())

    def charge(self, owner: Owner, size: int) -> None:
        """Bytes moved for the agent: its bucket may go into debt, which refuses its next requests."""
        bucket = self._transfers.get(owner)
        if bucket is not None:
            bucket.tokens -= size

    def charge_cpu(self, owner: Owner, limits: QuotaLimits, seconds: float) -> None:
        """CPU spent for the agent alone beyond moving its bytes (redaction): each CPU-second costs
        ``CPU_SECOND_COST`` seconds of its transfer rate, so at most about 1/CPU_SECOND_COST of a core per
        agent and worker is spent that way over time, and a burst of it puts the agent in debt."""
        self.charge(owner, int(seconds * CPU_SECOND_COST * self._transfer_rate(limits)[0]))

    async def pace(self, owner: Owner, size: int) -> None:
        """Charge one export page, then wait until the agent's bucket is out of debt."""
        bucket = self._transfers.get(owner)
        if bucket is None:
            return
        rate, burst = self._transfer_rate(await self._limits.limits_of(owner))
        bucket.tokens -= size
        if bucket.refill(self._clock(), rate, burst) < 0:
            await asyncio.sleep(-bucket.tokens / rate)

    def open_stream(self, owner: Owner) -> Callable[[], None]:
        """Count one of the agent's big answers (an export page, a search, a window read apart) being read
        in this worker, 429 past ``STREAMS_PER_AGENT``; it ends when the returned function is called
        (again: no effect)."""
        running = self._streams.get(owner, 0)
        if running >= STREAMS_PER_AGENT:
            raise self.refusal(
                owner,
                f"{owner.author} already reads {running} big answers (exports, searches, large windows) "
                "at once in this proxy worker; retry",
                1.0,
                self._clock(),
            )
        self._streams[owner] = running + 1
        ended = False

        def end() -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            left = self._streams[owner] - 1
            if left:
                self._streams[owner] = left
            else:
                del self._streams[owner]

        return end

    def _transfer_rate(self, limits: QuotaLimits) -> tuple[float, float]:
        """This worker's share of the agent's transfer rate and burst (the burst at least two bodies)."""
        share = self._share
        return limits.bytes_per_second / share, max(limits.bytes_burst / share, 2.0 * env.MAX_BODY_BYTES)

    def _request_rate(self, limits: QuotaLimits) -> tuple[float, float]:
        """This worker's share of the agent's request rate and burst (the burst at least one request)."""
        share = self._share
        return limits.requests_per_second / share, max(1.0, limits.burst / share)

    def _transfer_bucket(self, owner: Owner, limits: QuotaLimits, now: float) -> TokenBucket | None:
        """The agent's transfer bucket, opened full (and then None) on its first request."""
        bucket = self._transfers.get(owner)
        if bucket is None:
            if len(self._transfers) >= _REMEMBERED:
                self._transfers.clear()
            self._transfers[owner] = TokenBucket(self._transfer_rate(limits)[1], now)
        return bucket

    def _check_transfer(self, owner: Owner, limits: QuotaLimits, now: float) -> None:
        bucket = self._transfer_bucket(owner, limits, now)
        rate, burst = self._transfer_rate(limits)
        if bucket is not None and bucket.refill(now, rate, burst) < 0:
            raise self.refusal(
                owner,
                f"{owner.author} is over its transfer rate of {limits.bytes_per_second:g} bytes/s",
                -bucket.tokens / rate,
                now,
            )

    def _take_token(self, owner: Owner, limits: QuotaLimits, now: float) -> None:
        bucket = self._buckets.get(owner)
        if bucket is None:
            if len(self._buckets) >= _REMEMBERED:
                self._buckets.clear()
            bucket = self._buckets[owner] = TokenBucket(self._request_rate(limits)[1], now)
        wait = bucket.take(now, *self._request_rate(limits))
        if wait:
            raise self.refusal(
                owner, f"{owner.author} is over its rate of {limits.requests_per_second:g} requests/s", wait, now
            )

    def refusal(self, owner: Owner, message: str, wait: float, now: float) -> RateLimited:
        """The 429 of an agent that may ask again in ``wait`` seconds (its ``Retry-After``, whole seconds).
        Held before it is answered (``hold_seconds``, at most ``REFUSAL_HOLD_SECONDS``) when the agent asks
        while a ``Retry-After`` it was given has not passed: refusing costs the proxy about what serving a
        small read does, and an agent that asks again at once on many connections would otherwise take a
        worker's CPU from every other with refusals alone. One that waits as told is answered at once."""
        retry_after = max(1, math.ceil(wait))
        until = self._refused_until.get(owner)
        hold = 0.0 if until is None else min(max(0.0, until - now), REFUSAL_HOLD_SECONDS)
        if until is None and len(self._refused_until) >= _REMEMBERED:
            self._refused_until.clear()
        self._refused_until[owner] = max(until or 0.0, now + hold + retry_after)
        return RateLimited(message, retry_after, hold)

    async def check_storage(self, limits: QuotaLimits, key: str) -> None:
        """Admit a write to a second conversation of an admitted operation (a fork's new one) against the
        agent's storage quota (507 otherwise)."""
        if self._ledger is not None:
            await self._check_storage(limits, key)

    async def _check_storage(self, limits: QuotaLimits, key: str) -> None:
        ledger = self._ledger
        assert ledger is not None
        if ledger.atomic:
            return  # the store checks, writes and accounts in one script, with the limits the write hands it
        usage = await ledger.reserve(key, limits.max_conversations, limits.max_bytes)
        if usage.verdict:
            raise refusal(usage.verdict, limits.max_conversations, limits.max_bytes)
