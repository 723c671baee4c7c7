"""Per-agent quotas: stored conversations and bytes (507 when full), a request rate and a transfer rate
(429).

Limits are the chart's defaults (``SESSIONMEM_QUOTA_*``), overridden per agent by its AgentDeployment's
``spec.sessionMemory.quota`` {maxConversations, maxBytes, requestsPerSecond}, read from the API server and
cached briefly (the registry membership's cache period). In dev auth mode there is no API server: the
defaults apply to every agent.

What is exact and what is approximate (docs/quotas.md):

- Storage is counted per space by ``store.UsageLedger``: an agent's private conversations (perUser buckets
  included), or a registry's shared ones (checked against the writing agent's limits). The conversation
  count is exact: on a standalone Valkey the check, the write and its accounting are one script; on a
  Cluster a write is first admitted by one atomic reservation, which counts a new conversation at once.
  A write is refused only when the space is already at the byte limit (never because of its own size),
  so on a Cluster a space ends at most one batch per concurrent writer over its byte quota. A
  conversation that already exists may always be written when the count is full. Expired conversations
  stop counting when their TTL passes.
- The rate is a token bucket per agent in each proxy worker process: with N workers (or replicas) an agent
  gets up to N times its rate in total. Every operation costs one token.
- The transfer rate is a second bucket per agent and worker, counted in bytes: an agent whose bucket is
  in debt is refused before its body is read (the proxy neither reads nor parses what it sends); a body
  is charged by its size once served, an answer by its size once built, an export page by its size, each
  page answered once the bucket is out of debt (an export is paced, not refused). An agent whose bucket
  is in debt is refused until it is not. At most ``STREAMS_PER_AGENT`` export pages of an agent are read
  at once in a worker. Without it, one tenant exporting huge conversations in a loop takes the proxy's
  CPU from every other (docs/benchmarks.md, noisy neighbour).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import orjson

from sessionmem_core import api, env, kube
from sessionmem_core.env import ProxySettings
from sessionmem_core.errors import RateLimited
from sessionmem_core.keys import Owner
from sessionmem_proxy.buckets import TokenBucket
from sessionmem_proxy.store import UsageLedger, refusal

# Operations that store something, and so are checked against the storage quota.
WRITES = frozenset(operation.op for operation in api.MEMORY_OPERATIONS if operation.writes)
# Operations paced by the transfer rate rather than refused by it (an export's pages wait for the bucket).
PACED = frozenset({"export"})
_REMEMBERED = 10_000
STREAMS_PER_AGENT = 2


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
        perUser flag then reads None, and the key resolver fails closed on it (keying.py). An agent with no
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
        self, limits: LimitSource, ledger: UsageLedger | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._limits = limits
        self._ledger = ledger
        self._clock = clock
        self._buckets: dict[Owner, TokenBucket] = {}
        self._transfers: dict[Owner, TokenBucket] = {}
        self._streams: dict[Owner, int] = {}

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

    async def pace(self, owner: Owner, size: int) -> None:
        """Charge one export page, then wait until the agent's bucket is out of debt."""
        bucket = self._transfers.get(owner)
        if bucket is None:
            return
        limits = await self._limits.limits_of(owner)
        bucket.tokens -= size
        if bucket.refill(self._clock(), limits.bytes_per_second, limits.bytes_burst) < 0:
            await asyncio.sleep(-bucket.tokens / limits.bytes_per_second)

    def open_stream(self, owner: Owner) -> Callable[[], None]:
        """Count one of the agent's export pages being read in this worker, 429 past ``STREAMS_PER_AGENT``;
        it ends when the returned function is called (again: no effect)."""
        running = self._streams.get(owner, 0)
        if running >= STREAMS_PER_AGENT:
            raise RateLimited(f"{owner.author} already runs {running} exports in this proxy worker; retry")
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

    def _transfer_bucket(self, owner: Owner, limits: QuotaLimits, now: float) -> TokenBucket | None:
        """The agent's transfer bucket, opened full (and then None) on its first request."""
        bucket = self._transfers.get(owner)
        if bucket is None:
            if len(self._transfers) >= _REMEMBERED:
                self._transfers.clear()
            self._transfers[owner] = TokenBucket(limits.bytes_burst, now)
        return bucket

    def _check_transfer(self, owner: Owner, limits: QuotaLimits, now: float) -> None:
        bucket = self._transfer_bucket(owner, limits, now)
        if bucket is not None and bucket.refill(now, limits.bytes_per_second, limits.bytes_burst) < 0:
            wait = -bucket.tokens / limits.bytes_per_second
            raise RateLimited(
                f"{owner.author} is over its transfer rate of {limits.bytes_per_second:g} bytes/s", math.ceil(wait)
            )

    def _take_token(self, owner: Owner, limits: QuotaLimits, now: float) -> None:
        bucket = self._buckets.get(owner)
        if bucket is None:
            if len(self._buckets) >= _REMEMBERED:
                self._buckets.clear()
            bucket = self._buckets[owner] = TokenBucket(float(limits.burst), now)
        wait = bucket.take(now, limits.requests_per_second, float(limits.burst))
        if wait:
            raise RateLimited(
                f"{owner.author} is over its rate of {limits.requests_per_second:g} requests/s", math.ceil(wait)
            )

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
