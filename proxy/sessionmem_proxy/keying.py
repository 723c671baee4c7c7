"""Which key a verified caller's request maps to: the only place the proxy picks a layout."""

from __future__ import annotations

from sessionmem_core import api
from sessionmem_core.capability import Keyring, user_bucket, verify_capability
from sessionmem_core.errors import AuthUnavailable, Forbidden, InvalidRequest, Unauthenticated, UserCapabilityRequired
from sessionmem_core.ids import validate_conversation_id
from sessionmem_core.keys import Owner, Scope, per_user_prefix, session_prefix, shared_prefix
from sessionmem_proxy.identity import AgentIdentity
from sessionmem_proxy.membership import Membership
from sessionmem_proxy.quotas import LimitSource


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
    def __init__(
        self,
        membership: Membership | None = None,
        keyring: Keyring | None = None,
        policies: LimitSource | None = None,
    ) -> None:
        self._membership = membership
        self._keyring = keyring
        self._policies = policies

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
        policies = self._policies
        if policies is not None:
            limits = policies.cached(identity.owner) or await policies.limits_of(identity.owner)
            _refuse_per_user_without_user(identity, limits.per_user)
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
        self, identity: AgentIdentity, requested: Scope, conversation_id: str, user_capability: str | None
    ) -> tuple[str, str]:
        """(key, scope in effect) for one conversation."""
        prefix, scope = await self.resolve_prefix(identity, requested, user_capability)
        return prefix + validate_conversation_id(conversation_id), scope
