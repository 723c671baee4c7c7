"""The Valkey key layout (DESIGN.md section 4). Only the proxy (or a direct-mode launcher) builds keys,
always through this module, from a verified identity and a validated conversation id.

- session scope: ``mem:{namespace}/{agent}:{conversationId}``
- shared scope:  ``mem:shared:{registry}:{conversationId}``
- perUser:       ``mem:{namespace}/{agent}:u:{bucket}:{conversationId}``

Conversation ids never contain ``:`` or ``/``, so the three layouts cannot collide: a session key has
exactly two colons and one slash, a perUser key four colons and one slash, a shared key no slash.

Per-agent storage accounting (the proxy's quotas) keeps two keys per space:
``mem:usage:{<namespace>/<agent>}:expiry`` and ``mem:usage:{<namespace>/<agent>}:bytes``
(``{shared:<registry>}`` for a registry's shared conversations); the braces are a real hash tag, so both share
one Cluster slot. The catalogue lives in the same slot: ``...:meta`` (each conversation's created time,
entries, title and labels), ``...:summary`` (compaction summaries) and one newest-first index per listing,
``...:recent`` (the agent's own or a registry's conversations) or ``...:recent:<bucket>`` (a user
bucket's). They cannot collide with a conversation key (``usage:{`` is no namespace, and a shared key
starts ``mem:shared:``), no conversation listing (``mem:<namespace>/<agent>:*``) finds them, and they stay
under the ``mem:*`` keys the chart's Valkey ACL lets the proxy touch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from sessionmem_core.ids import validate_conversation_id, validate_dns_label

KEY_PREFIX = "mem:"


class Scope(StrEnum):
    SESSION = "session"
    SHARED = "shared"


@dataclass(frozen=True, slots=True)
class Owner:
    """Whose memory a key belongs to: always derived from a verified identity, never from the body.

    Made once per verified identity and then used on every request (as a key of the quota tables, as the
    author of stored entries): its hash and author are computed once, here."""

    namespace: str
    agent: str
    # ``<namespace>/<agent>``, as stored entries and messages name the agent.
    author: str = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_dns_label(self.namespace, "namespace")
        validate_dns_label(self.agent, "agent name")
        object.__setattr__(self, "author", f"{self.namespace}/{self.agent}")
        object.__setattr__(self, "_hash", hash((self.namespace, self.agent)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Owner], tuple[str, str]]:
        # Rebuilt (and re-hashed) where it is unpickled: a string's hash differs between processes.
        return Owner, (self.namespace, self.agent)


_BUCKET = re.compile(r"^[0-9a-f]{32}$")


def session_prefix(owner: Owner) -> str:
    return f"{KEY_PREFIX}{owner.namespace}/{owner.agent}:"


def shared_prefix(registry: str) -> str:
    return f"{KEY_PREFIX}shared:{validate_dns_label(registry, 'registry name')}:"


def per_user_prefix(owner: Owner, bucket: str) -> str:
    if not _BUCKET.match(bucket):
        raise ValueError("a user bucket is 32 lowercase hex characters derived by the proxy")
    return f"{session_prefix(owner)}u:{bucket}:"


def session_key(owner: Owner, conversation_id: str) -> str:
    return session_prefix(owner) + validate_conversation_id(conversation_id)


def shared_key(registry: str, conversation_id: str) -> str:
    return shared_prefix(registry) + validate_conversation_id(conversation_id)


def per_user_key(owner: Owner, bucket: str, conversation_id: str) -> str:
    return per_user_prefix(owner, bucket) + validate_conversation_id(conversation_id)


USAGE_PREFIX = f"{KEY_PREFIX}usage:"
_SHARED = "shared:"


def usage_space(conversation_key: str) -> str:
    """Whose storage a conversation key counts against: ``<namespace>/<agent>`` for session and perUser
    keys (perUser buckets are the agent's), ``shared:<registry>`` for a registry's shared conversations."""
    rest = conversation_key.removeprefix(KEY_PREFIX)
    if rest.startswith(_SHARED):
        return _SHARED + rest[len(_SHARED) :].split(":", 1)[0]
    return rest.split(":", 1)[0]


def usage_keys(space: str) -> tuple[str, str]:
    """(conversation expiries, conversation sizes) of one space's accounting, in one Cluster slot."""
    return f"{USAGE_PREFIX}{{{space}}}:expiry", f"{USAGE_PREFIX}{{{space}}}:bytes"


_BUCKET_IN_KEY = re.compile(r"^mem:[^:]+:u:([0-9a-f]{32}):")


def bucket_of(conversation_key: str) -> str | None:
    """The user bucket a conversation key (or a space prefix followed by anything) lives in, if any."""
    match = _BUCKET_IN_KEY.match(conversation_key)
    return match.group(1) if match else None


def catalogue_keys(conversation_key: str) -> tuple[str, str, str]:
    """(metadata, summaries, newest-first index) of the catalogue a conversation is listed in, in its
    space's accounting slot: one metadata hash and one summaries hash per space, one index per listing
    (the agent's own conversations, each user bucket's, a registry's shared ones)."""
    space = usage_space(conversation_key)
    bucket = bucket_of(conversation_key)
    listing = f":{bucket}" if bucket else ""
    tagged = f"{USAGE_PREFIX}{{{space}}}"
    return f"{tagged}:meta", f"{tagged}:summary", f"{tagged}:recent{listing}"


_ID = r'(?!\.\.?$)[^/:"\\\s\x00-\x1f\x7f-\x9f]{1,128}'
_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_LAYOUTS = (
    re.compile(rf"^mem:(?P<namespace>{_LABEL})/(?P<agent>{_LABEL}):(?P<cid>{_ID})$"),
    re.compile(rf"^mem:shared:(?P<registry>{_LABEL}):(?P<cid>{_ID})$"),
    re.compile(rf"^mem:(?P<namespace>{_LABEL})/(?P<agent>{_LABEL}):u:(?P<bucket>[0-9a-f]{{32}}):(?P<cid>{_ID})$"),
    re.compile(
        rf"^mem:usage:\{{(?:{_LABEL}/{_LABEL}|shared:{_LABEL})\}}:(?:expiry|bytes|meta|summary|recent(?::[0-9a-f]{{32}})?)$"
    ),
)


def conversation_of(agent_prefix: str, key: str) -> tuple[str | None, str] | None:
    """(user bucket or None, conversation id) of a key found under an agent's ``session_prefix``; None
    for a key that is not one of that agent's conversations (what an administrator's listing shows)."""
    if not key.startswith(agent_prefix):
        return None
    for layout in (_LAYOUTS[0], _LAYOUTS[2]):
        match = layout.match(key)
        if match is not None and session_prefix(Owner(match["namespace"], match["agent"])) == agent_prefix:
            groups = match.groupdict()
            return groups.get("bucket"), match["cid"]
    return None


def matches_layout(key: str) -> bool:
    """True when ``key`` is one of the three layouts above or a usage key (used to audit a Valkey keyspace)."""
    return any(layout.match(key) for layout in _LAYOUTS)
