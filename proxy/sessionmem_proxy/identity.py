"""Who is calling: the verified identity every key is built from, and the authenticator interface.

The proxy never takes an identity from a request body or a plain header: an authenticator turns the
bearer credential into an ``AgentIdentity`` or raises a typed 401/403/503.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sessionmem_core.devauth import DEV_TOKEN_PREFIX
from sessionmem_core.errors import Forbidden, InvalidRequest, Unauthenticated
from sessionmem_core.keys import Owner


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
