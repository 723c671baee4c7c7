r"""The identifier rules (conversation ids, message ids, Kubernetes names) and the Valkey key layout built
from them: the only module that spells a key.

A conversation id becomes part of a Valkey key and of a URL path, so this is the key/path-injection
guard: non-empty, at most 128 characters, none of ``/``, ``:``, ``"``, ``\``, whitespace or control
characters, nor U+FFFD, and not ``.`` or ``..`` (URL dot segments, which clients rewrite). Quotes and
backslashes are refused because ids are written into stored JSON as they are. U+FFFD is what the HTTP
server puts where a path's percent-escapes were not UTF-8 (``%FF``, an overlong ``%C0%AF``): an id holding
it could not be told from bytes that were never text, so it is refused rather than becoming another
conversation. No Unicode normalisation: NFC and NFD forms are two ids.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NewType

from sessionmem_core.errors import InvalidConversationId, InvalidMessageId, InvalidRequest

MAX_ID_LENGTH = 128

# Rejected anywhere in an id: the key separators, every Unicode whitespace and every control
# character (C0, DEL, C1), and U+FFFD. \s covers the Unicode whitespace set in Python's re.
_FORBIDDEN = re.compile(r'[/:"\\\s\x00-\x1f\x7f-\x9f\ufffd]')


def _id_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > MAX_ID_LENGTH:
        return f"must be at most {MAX_ID_LENGTH} characters (got {len(value)})"
    bad = _FORBIDDEN.search(value)
    if bad is not None:
        return (
            f"must not contain {bad.group()!r} ('/', ':', '\"', '\\', whitespace and control characters "
            "and U+FFFD are not allowed)"
        )
    if value in (".", ".."):
        # URL dot segments: HTTP clients normalise them away, so such an id could never be addressed.
        return "must not be '.' or '..'"
    return None


# A conversation id that passed the rule: what keys, paths and spans are built from. Each process parses
# the id it receives once (``parse_conversation_id``) and hands this on; code that needs an id takes this
# type, so mypy refuses a raw string there. A ``str`` at run time: no copy, no wrapper on the hot path.
ConversationId = NewType("ConversationId", str)


def parse_conversation_id(value: str) -> ConversationId:
    """The id, checked (typed 400 ``invalid_conversation_id`` otherwise)."""
    problem = _id_problem(value)
    if problem is not None:
        raise InvalidConversationId(f"conversationId {problem}")
    return ConversationId(value)


def validate_conversation_id(value: str) -> str:
    return parse_conversation_id(value)


def validate_message_id(value: str) -> str:
    problem = _id_problem(value)
    if problem is not None:
        raise InvalidMessageId(f"message id {problem}")
    return value


def is_valid_id(value: str) -> bool:
    return _id_problem(value) is None


def new_conversation_id() -> str:
    """A random opaque conversation id that satisfies the rule (URL-safe, 22 characters)."""
    return secrets.token_urlsafe(16)


# Minted message ids, drawn from the OS's random source a batch at a time (one system call per batch
# instead of per id). Unpredictable on purpose: a member of a shared conversation who could guess the
# ids the proxy will mint could store them first and have another member's entries dropped as retries.
_MESSAGE_ID_BYTES = 12
_MINT_BATCH = 256
_minted: list[str] = []
# A forked worker must not hand out the ids its parent already drew.
os.register_at_fork(after_in_child=_minted.clear)


def new_message_id() -> str:
    """A random message id (16 URL-safe characters, 96 bits). ``list.pop`` is atomic, so threads may
    share the batch."""
    try:
        return _minted.pop()
    except IndexError:
        width = _MESSAGE_ID_BYTES * 4 // 3
        batch = base64.urlsafe_b64encode(os.urandom(_MESSAGE_ID_BYTES * _MINT_BATCH)).decode()
        _minted.extend(batch[i : i + width] for i in range(0, len(batch), width))
        return _minted.pop()


# RFC 1123 label: what Kubernetes accepts for namespaces and most object names.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63


def validate_dns_label(value: str, what: str) -> str:
    if len(value) > DNS_LABEL_MAX or not _DNS_LABEL.match(value):
        raise InvalidRequest(f"{what} {value!r} is not a valid DNS-1123 label")
    return value


# --- The Valkey key layout (DESIGN.md section 4). Only the proxy (or a direct-mode launcher) builds keys,
# always through this module, from a verified identity and a validated conversation id.
#
# - session scope: ``mem:{namespace}/{agent}:{conversationId}``
# - shared scope:  ``mem:shared:{registry}:{conversationId}``
# - perUser:       ``mem:{namespace}/{agent}:u:{bucket}:{conversationId}``
#
# Conversation ids never contain ``:`` or ``/``, so the three layouts cannot collide: a session key has
# exactly two colons and one slash, a perUser key four colons and one slash, a shared key no slash.
#
# Per-agent storage accounting (the proxy's quotas) keeps two keys per space:
# ``mem:usage:{<namespace>/<agent>}:expiry`` and ``mem:usage:{<namespace>/<agent>}:bytes``
# (``{shared:<registry>}`` for a registry's shared conversations); the braces are a real hash tag, so both share
# one Cluster slot. The catalogue lives in the same slot: ``...:meta`` (each conversation's created time,
# entries, title and labels), ``...:summary`` (compaction summaries) and one newest-first index per listing,
# ``...:recent`` (the agent's own or a registry's conversations) or ``...:recent:<bucket>`` (a user
# bucket's). They cannot collide with a conversation key (``usage:{`` is no namespace, and a shared key
# starts ``mem:shared:``), no conversation listing (``mem:<namespace>/<agent>:*``) finds them, and they stay
# under the ``mem:*`` keys the chart's Valkey ACL lets the proxy touch. With encryption at rest, the same
# slot holds ``...:deks``: which data key each unit of the space writes with now (``data_key_marks``).

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


SIZES_PREFIX = f"{KEY_PREFIX}sizes:"


def sizes_key_of(conversation_key: str) -> str:
    """The list of a conversation's entry sizes, kept beside it by every write (``store``), so a read can
    find its window's bounds without copying the entries. Apart from every space's SCAN pattern (a
    namespace or registry label holds no ``:``); on a standalone server only (it shares no slot)."""
    return SIZES_PREFIX + conversation_key.removeprefix(KEY_PREFIX)


RETRY_PREFIX = f"{KEY_PREFIX}retry:"


def retry_index_of(conversation_key: str) -> str:
    """A digest of the idempotency key of each of a conversation's latest keyed appends, scored with its
    version (a sorted set kept by the append script), so an append whose key's digest is not among them
    need not read the entries to know it is no retry. Beside the conversation like ``sizes_key_of`` (same
    prefix rule, standalone only)."""
    return RETRY_PREFIX + conversation_key.removeprefix(KEY_PREFIX)


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
    re.compile(rf"^mem:(?:sizes|retry):(?:{_LABEL}/{_LABEL}:(?:u:[0-9a-f]{{32}}:)?|shared:{_LABEL}:){_ID}$"),
    re.compile(
        rf"^mem:usage:\{{(?:{_LABEL}/{_LABEL}|shared:{_LABEL})\}}:(?:expiry|bytes|meta|summary|deks|recent(?::[0-9a-f]{{32}})?)$"
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
    """True when ``key`` is one of the three layouts above, a conversation's sizes or retry index, or a
    usage key (used to audit a Valkey keyspace)."""
    return any(layout.match(key) for layout in _LAYOUTS)


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


def usage_keys_of(conversation_key: str) -> tuple[str, ...]:
    """The accounting keys (expiries, sizes) of the space a conversation counts against, then its
    catalogue's (metadata, summaries, the index it is listed in): one Cluster slot."""
    return (*usage_keys(usage_space(conversation_key)), *catalogue_keys(conversation_key))


def listing_key(space: str) -> str:
    """A key standing for any conversation directly under a space prefix (an agent's, a user bucket's, a
    registry's): its ``usage_keys_of`` are that listing's accounting and catalogue keys."""
    return space + "_"


# --- encryption at rest: the units one data key seals (``datakeys``) ---

_USER_BUCKET = ":u:"


def data_key_unit(conversation_key: str) -> str:
    """The unit a conversation's entries are sealed under: its key without ``mem:`` and the conversation
    id (``<namespace>/<agent>``, ``<namespace>/<agent>:u:<bucket>`` or ``shared:<registry>``; conversation
    ids hold no ``:``, so the unit is everything before the last one)."""
    return conversation_key[len(KEY_PREFIX) : conversation_key.rindex(":")]


def data_key_unit_of_space(prefix: str) -> str:
    """The unit of a space or bucket prefix as built here (``mem:<unit>:``)."""
    return prefix[len(KEY_PREFIX) : -1]


def data_key_space(unit: str) -> str:
    """The agent (or registry) a unit belongs to: erasing it erases every unit of the space."""
    return unit.split(_USER_BUCKET, 1)[0]


def data_key_marks(unit: str) -> str:
    """The hash naming the data key each unit of ``unit``'s space may write with now, in the space's
    accounting slot (``usage_keys_of``): the write scripts that seal check it in the write's own step."""
    return f"{USAGE_PREFIX}{{{data_key_space(unit)}}}:deks"
