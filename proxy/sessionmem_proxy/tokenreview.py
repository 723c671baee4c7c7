"""Pod identity from projected ServiceAccount tokens, verified with the Kubernetes TokenReview API.

Fail closed at every decision point: a token the API server does not vouch for under our audience is a
401, a vouched identity that is not a per-agent ServiceAccount is a 403, and an API server that cannot
be asked is a 503 (never a pass).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections import Counter, OrderedDict

import httpx
import orjson

from sessionmem_core import kube
from sessionmem_core.errors import AuthUnavailable, Forbidden, InvalidRequest, SessionMemError, Unauthenticated
from sessionmem_core.keys import Owner
from sessionmem_infra.serving import Rate, TokenBucket
from sessionmem_proxy.admission import AgentIdentity
from sessionmem_proxy.kubeapi import KubeAPI

# A verified identity is trusted for at most this long (and never past the token's own expiry less a
# margin). The API server keeps verified tokens for API_SERVER_TOKEN_CACHE_SECONDS of its own, so a
# deleted ServiceAccount or pod stops working within the sum, under 60 s (README, Auth).
MAX_CACHE_SECONDS = 45.0
API_SERVER_TOKEN_CACHE_SECONDS = 10.0
_EXPIRY_MARGIN_SECONDS = 30.0
# A token the API server refused is refused again without asking for this long.
NEGATIVE_CACHE_SECONDS = 10.0
CACHE_SIZE = 10_000
# API calls for tokens not in the cache, per second and in a burst (one budget per source; see below).
REVIEW_RATE = Rate(per_second=50.0, burst=100)
# The pod a projected token is bound to, as TokenReview reports it.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


def _token_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT, read without verifying it: only used to bound the cache."""
    try:
        payload = token.split(".")[1]
        claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        exp = claims.get("exp")
        return float(exp) if isinstance(exp, int | float) else None
    except (IndexError, ValueError, orjson.JSONDecodeError):
        return None


class TokenReviewAuthenticator:
    """Verifies bearer tokens with TokenReview, in front of which:

    - a bounded LRU cache of answers keyed by the token's SHA-256: identities for at most
      ``max_cache_seconds`` (45 s), refusals (401/403) for ``negative_cache_seconds`` (10 s);
    - single flight: concurrent requests with one unknown token wait on one API call;
    - a token bucket on API calls for unknown tokens, one per source (the client address, when the serving
      layer passes ``source``; else one global budget): a flood of garbage tokens costs the API server at
      most ``rate``, answered 503 (auth unavailable) beyond it, while cached tokens keep
      working;
    - a projected token must be bound to a pod (TokenReview's ``pod-name`` and ``pod-uid`` extras): a
      ServiceAccount token that is not (a long-lived Secret token, a TokenRequest without a pod) is a 401.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        api: KubeAPI,
        audience: str,
        *,
        max_cache_seconds: float = MAX_CACHE_SECONDS,
        negative_cache_seconds: float = NEGATIVE_CACHE_SECONDS,
        cache_size: int = CACHE_SIZE,
        rate: Rate = REVIEW_RATE,
        require_pod_binding: bool = True,
    ) -> None:
        self._http = http
        self._api = api
        self._audience = audience
        self._max_cache_seconds = max_cache_seconds
        self._negative_cache_seconds = negative_cache_seconds
        self._cache_size = cache_size
        self._rate = rate
        self._require_pod_binding = require_pod_binding
        self._cache: OrderedDict[bytes, tuple[float, AgentIdentity | SessionMemError]] = OrderedDict()
        self._inflight: dict[bytes, asyncio.Future[AgentIdentity]] = {}
        self._budgets: OrderedDict[str, TokenBucket] = OrderedDict()
        self.api_calls = 0
        # TokenReview calls by result (authenticated, rejected, unavailable): the proxy's /metrics.
        self.reviews: Counter[str] = Counter()

    async def authenticate(self, bearer_token: str | None, source: str | None = None) -> AgentIdentity:
        if bearer_token is None:
            raise Unauthenticated("missing bearer token")
        digest = hashlib.sha256(bearer_token.encode()).digest()
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None:
            if cached[0] > now:
                self._cache.move_to_end(digest)
                if isinstance(cached[1], SessionMemError):
                    raise type(cached[1])(cached[1].message)
                return cached[1]
            del self._cache[digest]
        pending = self._inflight.get(digest)
        if pending is not None:
            return await asyncio.shield(pending)
        self._spend(source or "", now)
        future: asyncio.Future[AgentIdentity] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve_exception)
        self._inflight[digest] = future
        try:
            identity = await self._review(bearer_token)
        except (Unauthenticated, Forbidden) as exc:
            self._remember(digest, now + self._negative_cache_seconds, exc)
            future.set_exception(type(exc)(exc.message))
            raise
        except BaseException as exc:
            future.set_exception(exc if isinstance(exc, Exception) else AuthUnavailable("review cancelled"))
            raise
        finally:
            del self._inflight[digest]
        ttl = self._max_cache_seconds
        exp = _token_expiry(bearer_token)
        if exp is not None:
            ttl = min(ttl, exp - time.time() - _EXPIRY_MARGIN_SECONDS)
        if ttl > 0:
            self._remember(digest, now + ttl, identity)
        future.set_result(identity)
        return identity

    def _remember(self, digest: bytes, until: float, answer: AgentIdentity | SessionMemError) -> None:
        self._cache[digest] = (until, answer)
        self._cache.move_to_end(digest)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _spend(self, source: str, now: float) -> None:
        bucket = self._budgets.get(source)
        if bucket is None:
            bucket = self._budgets[source] = TokenBucket(float(self._rate.burst), now)
        if bucket.take(now, self._rate.per_second, self._rate.burst):
            raise AuthUnavailable("too many unknown tokens: identity checks are rate limited, retry shortly")
        self._budgets.move_to_end(source)
        while len(self._budgets) > self._cache_size:
            self._budgets.popitem(last=False)

    async def _review(self, token: str) -> AgentIdentity:
        self.api_calls += 1
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self._audience]},
        }
        status = await self._api.review(self._http, review, self.reviews)
        self.reviews["authenticated" if status.get("authenticated") else "rejected"] += 1
        if not status.get("authenticated"):
            raise Unauthenticated("token rejected: " + str(status.get("error", "not authenticated"))[:200])
        if self._audience not in (status.get("audiences") or []):
            raise Unauthenticated(f"token is not for audience {self._audience!r}")
        user = status.get("user") or {}
        username = str(user.get("username", ""))
        if self._require_pod_binding:
            extra = user.get("extra") or {}
            if not extra.get(POD_NAME_EXTRA) or not extra.get(POD_UID_EXTRA):
                raise Unauthenticated("token is not bound to a pod: use the projected token the operator mounts")
        parsed = kube.parse_service_account_username(username)
        agent = kube.agent_from_service_account(parsed[1]) if parsed else None
        if parsed is None or agent is None:
            raise Forbidden(f"{username!r} is not an agent identity")
        try:
            owner = Owner(namespace=parsed[0], agent=agent)
        except InvalidRequest as exc:
            raise Forbidden(f"{username!r} is not an agent identity") from exc
        return AgentIdentity(owner=owner)

    async def aclose(self) -> None:
        return None  # the HTTP client belongs to the app that made it


def _retrieve_exception(future: asyncio.Future[AgentIdentity]) -> None:
    # Nobody may be waiting on a failed review: its failure is its caller's, not worth a log line.
    if not future.cancelled():
        future.exception()
