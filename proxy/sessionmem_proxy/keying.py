"""Which key a verified caller's request maps to: the only place the proxy picks a layout."""

from __future__ import annotations

from sessionmem_core.capability import Keyring, user_bucket, verify_capability
from sessionmem_core.errors import InvalidRequest, Unauthenticated
from sessionmem_core.ids import validate_conversation_id
from sessionmem_core.keys import Scope, per_user_prefix, session_prefix, shared_prefix
from sessionmem_proxy.identity import AgentIdentity
from sessionmem_proxy.membership import Membership


class KeyResolver:
    def __init__(self, membership: Membership | None = None, keyring: Keyring | None = None) -> None:
        self._membership = membership
        self._keyring = keyring

    async def resolve_prefix(
        self, identity: AgentIdentity, requested: Scope, user_capability: str | None
    ) -> tuple[str, str]:
        """(key prefix, scope in effect) of the space a request works in.

        - A user capability selects the user's private bucket (perUser is private scope only). Without
          a configured key the proxy cannot verify one, so it refuses it (fail closed).
        - Shared scope needs verified registry membership; a non-member keeps its private layout, never
          a rootless shared key. Membership that cannot be resolved fails closed (503).
        """
        if user_capability is not None:
            return self.user_prefix(identity, user_capability), Scope.SESSION.value
        if requested is Scope.SHARED:
            registry = identity.registry
            if registry is None and self._membership is not None:
                registry = await self._membership.registry_of(identity.owner)
            if registry:
                return shared_prefix(registry), Scope.SHARED.value
        return session_prefix(identity.owner), Scope.SESSION.value

    def user_prefix(self, identity: AgentIdentity, user_capability: str | None) -> str:
        if user_capability is None:
            raise InvalidRequest("this operation needs the end user's capability")
        if self._keyring is None:
            raise Unauthenticated("this proxy has no capability key: per-user memory is not enabled")
        subject = verify_capability(self._keyring, user_capability, identity.owner)
        return per_user_prefix(identity.owner, user_bucket(self._keyring, identity.owner, subject))

    async def resolve(
        self, identity: AgentIdentity, requested: Scope, conversation_id: str, user_capability: str | None
    ) -> tuple[str, str]:
        """(key, scope in effect) for one conversation."""
        prefix, scope = await self.resolve_prefix(identity, requested, user_capability)
        return prefix + validate_conversation_id(conversation_id), scope
