"""Pod identity from projected ServiceAccount tokens, verified with the Kubernetes TokenReview API.

Fail closed at every decision point: a token the API server does not vouch for under our audience is a
401, a vouched identity that is not a per-agent ServiceAccount is a 403, and an API server that cannot
be asked is a 503 (never a pass).
"""

from __future__ import annotations

import base64
import time
from collections import OrderedDict
from typing import Any

import httpx
import orjson

from sessionmem_core import kube
from sessionmem_core.errors import AuthUnavailable, Forbidden, InvalidRequest, Unauthenticated
from sessionmem_core.keys import Owner
from sessionmem_proxy.identity import AgentIdentity
from sessionmem_proxy.kubeapi import KubeAPI

# Reviews are cached until shortly before the token expires, and never longer than this.
_MAX_CACHE_SECONDS = 300.0
_EXPIRY_MARGIN_SECONDS = 30.0
_CACHE_SIZE = 10_000


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
    def __init__(self, http: httpx.AsyncClient, api: KubeAPI, audience: str) -> None:
        self._http = http
        self._api = api
        self._audience = audience
        self._cache: OrderedDict[str, tuple[float, AgentIdentity]] = OrderedDict()

    async def authenticate(self, bearer_token: str | None) -> AgentIdentity:
        if bearer_token is None:
            raise Unauthenticated("missing bearer token")
        now = time.monotonic()
        cached = self._cache.get(bearer_token)
        if cached is not None:
            if cached[0] > now:
                self._cache.move_to_end(bearer_token)
                return cached[1]
            del self._cache[bearer_token]
        identity = await self._review(bearer_token)
        ttl = _MAX_CACHE_SECONDS
        exp = _token_expiry(bearer_token)
        if exp is not None:
            ttl = min(ttl, exp - time.time() - _EXPIRY_MARGIN_SECONDS)
        if ttl > 0:
            self._cache[bearer_token] = (now + ttl, identity)
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return identity

    async def _review(self, token: str) -> AgentIdentity:
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self._audience]},
        }
        try:
            response = await self._http.post(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                content=orjson.dumps(review),
                headers={"Authorization": f"Bearer {self._api.bearer()}", "Content-Type": "application/json"},
            )
        except (httpx.HTTPError, OSError) as exc:
            raise AuthUnavailable(f"TokenReview unavailable: {type(exc).__name__}") from exc
        if response.status_code != 201 and response.status_code != 200:
            raise AuthUnavailable(f"TokenReview answered HTTP {response.status_code}")
        status: dict[str, Any] = orjson.loads(response.content).get("status", {})
        if not status.get("authenticated"):
            raise Unauthenticated("token rejected: " + str(status.get("error", "not authenticated"))[:200])
        if self._audience not in (status.get("audiences") or []):
            raise Unauthenticated(f"token is not for audience {self._audience!r}")
        username = str(status.get("user", {}).get("username", ""))
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
