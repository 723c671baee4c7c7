"""Which key a verified caller's request maps to. The only place the proxy picks a layout."""

from __future__ import annotations

from sessionmem_core.errors import Unauthenticated
from sessionmem_core.keys import Scope, session_key, shared_key
from sessionmem_proxy.identity import AgentIdentity


def resolve_key(
    identity: AgentIdentity, requested: Scope, conversation_id: str, user_capability: str | None
) -> tuple[str, str]:
    """(key, scope in effect). Shared scope needs verified registry membership: a non-member asking for
    it keeps its private layout, never a rootless shared key."""
    if user_capability is not None:
        # Per-user buckets come with the capability verifier; until one is configured, fail closed.
        raise Unauthenticated("per-user capabilities are not accepted by this proxy")
    if requested is Scope.SHARED and identity.registry:
        return shared_key(identity.registry, conversation_id), Scope.SHARED.value
    return session_key(identity.owner, conversation_id), Scope.SESSION.value
