"""Every Valkey key the proxy uses, built here and nowhere else in the proxy: which key a verified
caller's request maps to (the only place the proxy picks a layout), the spaces an administrator names,
the patterns that list a space, and the accounting keys a conversation counts against. The layouts
themselves are the contract's (``sessionmem_core.keys``)."""

from __future__ import annotations

from sessionmem_core import api
from sessionmem_core.capability import Keyring, user_bucket, verify_capability
from sessionmem_core.errors import AuthUnavailable, Forbidden, InvalidRequest, Unauthenticated, UserCapabilityRequired
from sessionmem_core.ids import ConversationId
from sessionmem_core.keys import (
    Owner,
    Scope,
    conversation_of,
    per_user_prefix,
    session_prefix,
    shared_prefix,
    usage_keys,
    usage_space,
)
from sessionmem_proxy.identity import AgentIdentity
from sessionmem_proxy.membership import Membership


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


# --- the spaces an administrator names, and listing them ---


def agent_space(owner: Owner) -> str:
    """The prefix of all of an agent's memory (its users' buckets included)."""
    return session_prefix(owner)


def bucket_space(owner: Owner, bucket: str) -> str:
    """The prefix of one user bucket of an agent, named by the bucket a listing showed."""
    return per_user_prefix(owner, bucket)


def registry_space(registry: str) -> str:
    """The prefix of a registry team's shared conversations (a typed 400 for a name that is not a DNS label)."""
    return shared_prefix(registry)


def conversation_key(space: str, conversation: ConversationId) -> str:
    return space + conversation


def sibling_key(key: str, conversation: ConversationId, other: ConversationId) -> str:
    """The key of conversation ``other`` in the same space (scope and user bucket) as ``key``, which is
    ``conversation``'s: where a fork goes."""
    return key[: len(key) - len(conversation)] + other


def keys_under(space: str) -> str:
    """The SCAN pattern of every key in a space."""
    return space + "*"


def conversation_in(space: str, key: str) -> str:
    """The conversation id of a key found directly under ``space``."""
    return key[len(space) :]


def user_bucket_keys(namespace: str) -> str:
    """The SCAN pattern of every per-user key of a namespace's agents."""
    return f"{_namespace_space(namespace)}*:u:*"


def agent_of(namespace: str, key: str) -> str:
    """The agent a key of a namespace's (``user_bucket_keys``) belongs to."""
    return key[len(_namespace_space(namespace)) :].split(":", 1)[0]


def _namespace_space(namespace: str) -> str:
    return session_prefix(Owner(namespace, "any"))[: -len("any:")]  # mem:{namespace}/


def bucket_and_conversation(owner: Owner, key: str) -> tuple[str | None, str] | None:
    """(user bucket or None, conversation id) of one of an agent's keys; None for any other key."""
    return conversation_of(session_prefix(owner), key)


def usage_keys_of(conversation_key: str) -> tuple[str, str]:
    """The accounting keys (expiries, sizes) of the space a conversation counts against."""
    return usage_keys(usage_space(conversation_key))
