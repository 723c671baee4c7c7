"""The HTTP surface of the memory API: paths, headers, query parameters, and the memory operations
(``MEMORY_OPERATIONS``), declared once: the proxy's route table, the launcher's router and forwarder and
both OpenAPI documents are built from them.

Pure constants and functions, no models: the launcher imports this module on every cold start, so it
stays free of pydantic; the request/response models live in ``sessionmem_core.wire``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote

from sessionmem_core import env
from sessionmem_core.errors import NotFound

API_PREFIX = "/v1"

# Query parameters a write takes besides ``scope``: how many entries to keep and the TTL it refreshes.
CAP_PARAM = "cap"
TTL_PARAM = "ttlSeconds"
SCOPE_PARAM = "scope"
REDACT_PARAM = "redact"
# The proxy's built-in redactors, in the order it applies them (cards before phones: a card number would
# otherwise look like a long phone number). Any other name must be defined by the proxy's
# SESSIONMEM_REDACT_PATTERNS; the operator checks an agent's list against both.
BUILTIN_REDACTORS = ("email", "card", "phone")
LIMIT_PARAM = "limit"
# Where a page of an export starts: the ``nextOffset`` of the page before (the proxy pages exports).
OFFSET_PARAM = "offset"
# An administrator's export page says where the next page starts, absent on the last.
NEXT_OFFSET_HEADER = "x-sessionmem-next-offset"

# Response headers that repeat what a memory response says, so the launcher can trace it unparsed.
VERSION_HEADER = "x-sessionmem-version"
ENTRIES_HEADER = "x-sessionmem-entries"
SCOPE_HEADER = "x-sessionmem-scope"
# Set by the managed loop on its answer: "ok", "unavailable" (answered without context) or "not-stored".
MEMORY_STATUS_HEADER = "x-sessionmem-memory"

# Headers.
CONVERSATION_ID_HEADER = "x-conversation-id"
# The end user's signed run capability: the caller (BFF) sends it to the serving port; the launcher keeps it.
USER_CAPABILITY_HEADER = "x-sessionmem-user-capability"
# The opaque handle of one turn, which the launcher sends to the agent instead of the capability and the
# agent sends back on its memory calls during that turn.
TURN_HEADER = "x-sessionmem-turn"
TRACEPARENT_HEADER = "traceparent"
# An append's idempotency key: a retry with the same key on the same conversation is answered as its
# original was, whatever the entries' ids.
IDEMPOTENCY_KEY_HEADER = "idempotency-key"
# A conditional write's expected version (a read's ``version``); '*' or absent: any.
IF_MATCH_HEADER = "if-match"
# Conditional reads (RFC 9110, 13.1.2): a read or export answers its entity tag (``ETAG_HEADER``, made by
# ``etag``), and one sent back in If-None-Match that is still current is answered 304 without a body.
IF_NONE_MATCH_HEADER = "if-none-match"
ETAG_HEADER = "etag"
NOT_MODIFIED = 304
# An append that asks for it (``Prefer: return=representation``, RFC 7240) answers the entries as stored,
# and its ETag: the state right after it, so a client that held the state right before it holds this one.
PREFER_HEADER = "prefer"
RETURN_REPRESENTATION = "return=representation"
# Headers an agent might set to claim an identity; the launcher drops all of them before forwarding.
IDENTITY_HEADERS = frozenset(
    {
        "authorization",
        "x-sessionmem-identity",
        "x-sessionmem-agent",
        "x-sessionmem-namespace",
        "x-sessionmem-user",
        "x-user-id",
        "x-forwarded-user",
        "x-remote-user",
        USER_CAPABILITY_HEADER,
    }
)


def etag(life: str, version: int, summary: str | None = None) -> str:
    """The entity tag of a conversation's state: the id of its life (a new one each time it is created,
    kept on its newest entry by the same atomic write that makes it, so a conversation erased and created
    again never repeats an earlier tag at the same version), its version (every write moves it on), and for
    an answer that carries a compaction summary, a digest of that summary (recording one leaves the version
    as it is). A strong validator: one tag, one answer, for every read of the same parameters."""
    tag = f"{life}.{version}" if summary is None else f"{life}.{version}.{summary}"
    return f'"{tag}"'


def etag_parts(value: str) -> tuple[str, int, str | None] | None:
    """(life, version, summary digest or None) of an entity tag ``etag`` made; None for any other value
    (a list, a weak tag, ``*``): such a precondition is never met, so the answer is a full one."""
    if len(value) < 5 or value[0] != '"' or value[-1] != '"':
        return None
    parts = value[1:-1].split(".")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1].isascii() or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), parts[2] if len(parts) == 3 else None


_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def quote_component(text: str) -> str:
    """``text`` percent-encoded for a path segment or a query value. Most ids and values need nothing
    (new_conversation_id makes URL-safe ones): those skip ``quote``, which costs a call per id."""
    if _UNRESERVED.issuperset(text):
        return text
    return quote(text, safe="")


def query_string(params: Iterable[tuple[str, str]]) -> str:
    """``name=value&...``, each part percent-encoded by :func:`quote_component`."""
    return "&".join(f"{quote_component(name)}={quote_component(value)}" for name, value in params)


def parse_query(text: str) -> list[tuple[str, str]]:
    """A query string (as granian hands it over) as (name, value) pairs, in order, blank values kept:
    ``parse_qsl``'s answer. Nothing escaped is what every client of ours sends, and splitting it is a
    fraction of parse_qsl's cost on a path every memory call takes (the launcher and the proxy both parse
    each call's query)."""
    if "%" in text or "+" in text:
        return parse_qsl(text, keep_blank_values=True)
    return [(name, value) for name, _, value in (pair.partition("=") for pair in text.split("&") if pair)]


def _segment(conversation_id: str) -> str:
    # Percent-encoded: a valid id may hold '#', '?' or '%', which a URL would otherwise read as syntax.
    return quote_component(conversation_id)


def entries_path(conversation_id: str) -> str:
    return f"{API_PREFIX}/conversations/{_segment(conversation_id)}/entries"


def conversation_path(conversation_id: str) -> str:
    return f"{API_PREFIX}/conversations/{_segment(conversation_id)}"


def search_path(conversation_id: str) -> str:
    return f"{API_PREFIX}/conversations/{_segment(conversation_id)}/search"


def export_path(conversation_id: str) -> str:
    return f"{API_PREFIX}/conversations/{_segment(conversation_id)}/export"


# Agent-wide and user-wide lifecycle operations (no conversation id in the path).
CONVERSATIONS_PATH = f"{API_PREFIX}/conversations"
USER_CONVERSATIONS_PATH = f"{API_PREFIX}/users/me/conversations"
# The launcher's serving port: ready only while the agent behind it accepts connections (the readiness
# probe the operator renders), so no turn reaches a pod whose agent is not listening yet. A pod's first
# ready answer also waits, within the same time, for the proxy to answer (fail-open: ready without it).
AGENT_READY_PATH = "/readyz"
# How long that readiness answer waits for the agent to start listening before it says 502: the probe
# succeeds the moment the agent is up, and an agent that starts within it leaves no failed probe behind
# (each one is a Warning Event, on every pod start). The operator's probe timeout is longer.
AGENT_READY_WAIT_SECONDS = 5.0
# The proxy's readiness: 200 while its memory backend (Valkey) answers, 503 with the cause otherwise. The
# kubelet probes it, and the operator follows it into every agent's MemoryReady condition.
PROXY_READY_PATH = "/readyz"
# Administration: a person's act, authorised by Kubernetes RBAC on agentdeployments/memory.
ADMIN_AGENT_MEMORY_PATH = f"{API_PREFIX}/admin/namespaces/{{namespace}}/agents/{{agent}}/memory"
ADMIN_NAMESPACE_USER_MEMORY_PATH = f"{API_PREFIX}/admin/namespaces/{{namespace}}/users/{{user}}/memory"
ADMIN_REGISTRY_MEMORY_PATH = f"{API_PREFIX}/admin/registries/{{registry}}/memory"
ADMIN_USER_MEMORY_PATH = f"{API_PREFIX}/admin/namespaces/{{namespace}}/agents/{{agent}}/users/{{user}}/memory"
# Reading an agent's memory (kubectl sessionmem): RBAC get/list on agentdeployments/memory; erasing one
# conversation: delete. ``user`` (or ``bucket``) as a query parameter selects an end user's bucket.
ADMIN_AGENT_PATH = f"{API_PREFIX}/admin/namespaces/{{namespace}}/agents/{{agent}}"
ADMIN_CONVERSATIONS_PATH = f"{ADMIN_AGENT_PATH}/conversations"
ADMIN_CONVERSATION_PATH = f"{ADMIN_AGENT_PATH}/conversations/{{conversationId}}"
ADMIN_EXPORT_PATH = f"{ADMIN_AGENT_PATH}/export"
ADMIN_STATS_PATH = f"{ADMIN_AGENT_PATH}/stats"
ADMIN_USER_QUERY = "user"
ADMIN_BUCKET_QUERY = "bucket"
ADMIN_CONVERSATION_QUERY = "conversation"
ADMIN_LAST_QUERY = "last"
# The admin export's body: one JSON object per line (an entry, with its conversation id and bucket).
NDJSON = "application/x-ndjson"


@dataclass(frozen=True, slots=True)
class Parameter:
    """One parameter of an operation: its wire name, where it travels (path, query, header) and its JSON
    schema (bounds, default), which both the proxy's parser and the OpenAPI documents are made from."""

    name: str
    location: str
    schema: Mapping[str, Any]
    description: str = ""
    required: bool = False


@dataclass(frozen=True, slots=True)
class MemoryOperation:
    """One memory operation, declared once for every component that serves or documents it: the proxy's
    route table, the launcher's router and forwarder, and both OpenAPI documents. ``response`` and
    ``request`` name models of ``sessionmem_core.wire`` (named, so this module stays free of pydantic);
    ``params``: what the operation itself takes (identity, scope and the pod's write parameters are each
    server's own)."""

    op: str
    method: str
    path: str  # an OpenAPI path template; {conversationId} is the conversation's id
    summary: str
    response: str | None
    request: str | None = None
    params: tuple[Parameter, ...] = ()
    # Stores (admitted against the storage quota, and sent the pod's write parameters: cap, TTL, redactors).
    writes: bool = False
    # Its name among the memory operations of OpenTelemetry's GenAI semantic conventions (in development:
    # ``gen_ai.operation.name``), where one fits; its spans carry it beside ``memory.*`` (docs/observability.md).
    genai: str | None = None
    # What it may answer besides 200, what every operation may (each server says that) and what its body
    # and its storing may (``statuses``): its own errors, with what each means.
    answers: Mapping[int, str] = field(default_factory=dict)

    @property
    def statuses(self) -> dict[int, str]:
        """Every status this operation may answer besides 200 and those every operation may: its body's
        (``BODY_ANSWERS``), its storing's (``STORE_ANSWERS``) and its own."""
        return {**(BODY_ANSWERS if self.request else {}), **(STORE_ANSWERS if self.writes else {}), **self.answers}

    @property
    def on_conversation(self) -> bool:
        return CONVERSATION_ID_TEMPLATE in self.path


# What a request with a body may also be answered, and one that stores.
BODY_ANSWERS: Mapping[int, str] = {
    408: "The request body did not arrive within the body timeout",
    413: "The request body exceeds the body limit",
}
STORE_ANSWERS: Mapping[int, str] = {507: "The agent's storage quota is full (quota_exceeded)"}
_VERSION_MISMATCH = {412: "If-Match does not match the version (version_conflict)"}

CONVERSATION_ID_TEMPLATE = "{conversationId}"
CONVERSATION_PATH_TEMPLATE = f"{API_PREFIX}/conversations/{CONVERSATION_ID_TEMPLATE}"
CONVERSATION_ID = Parameter(
    "conversationId",
    "path",
    {"type": "string", "minLength": 1, "maxLength": 128},
    "Conversation id (sessionmem_core.keys): percent-encoded UTF-8; NFC and NFD forms are two ids",
    required=True,
)
_IF_MATCH = Parameter(
    IF_MATCH_HEADER,
    "header",
    {"type": "string"},
    "Expected version (as returned by a read); '*' or absent: any. A mismatch is a 412 version_conflict",
)
_IF_NONE_MATCH = Parameter(
    IF_NONE_MATCH_HEADER,
    "header",
    {"type": "string"},
    "The ETag of an earlier answer to the same read: while it is current, the answer is a 304 without a body",
)
_NOT_MODIFIED = {NOT_MODIFIED: "Not Modified: the If-None-Match ETag is current (no body; the ETag header repeats it)"}
_CATALOGUE_CURSOR = Parameter(
    "cursor",
    "query",
    # A score is a write time in Unix ms: 16 digits hold every one Valkey keeps exactly (below 2**53).
    {"type": "string", "minLength": 1, "maxLength": 26, "pattern": "^[0-9]{1,16}(-[0-9]{1,9})?$", "default": "0"},
    "Where the page starts (the nextCursor of the page before; 0: the newest)",
)

MEMORY_OPERATIONS: tuple[MemoryOperation, ...] = (
    MemoryOperation(
        "get",
        "GET",
        f"{CONVERSATION_PATH_TEMPLATE}/entries",
        "Read the last entries of a conversation",
        "History",
        params=(
            Parameter(
                LIMIT_PARAM,
                "query",
                {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": env.MAX_READ_LIMIT,
                    "default": env.DEFAULT_REPLAY_MESSAGES,
                },
                "How many of the newest entries",
            ),
            Parameter(
                "summary",
                "query",
                {"type": "boolean", "default": False},
                "Also return the rolling summary of older turns",
            ),
            _IF_NONE_MATCH,
        ),
        genai="search_memory",
        answers=_NOT_MODIFIED,
    ),
    MemoryOperation(
        "append",
        "POST",
        f"{CONVERSATION_PATH_TEMPLATE}/entries",
        "Append a batch (normally one user/assistant exchange) atomically",
        "AppendResponse",
        "AppendRequest",
        writes=True,
        params=(
            Parameter(
                IDEMPOTENCY_KEY_HEADER,
                "header",
                {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9._:-]+$"},
                "A retry with the same key (inside the retry window) is answered as its original was: "
                "duplicate, nothing stored, whatever the ids and If-Match; entry ids may then repeat",
            ),
            _IF_MATCH,
            Parameter(
                PREFER_HEADER,
                "header",
                {"type": "string"},
                f"{RETURN_REPRESENTATION}: also answer the entries as stored (entries) and the ETag of the "
                "conversation right after this append",
            ),
        ),
        genai="update_memory",
        answers=_VERSION_MISMATCH,
    ),
    MemoryOperation(
        "search",
        "GET",
        f"{CONVERSATION_PATH_TEMPLATE}/search",
        "Keyword search within one conversation",
        "SearchResponse",
        params=(
            Parameter("q", "query", {"type": "string", "minLength": 1, "maxLength": 1024}, "Words to look for", True),
            Parameter(
                LIMIT_PARAM,
                "query",
                {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
                "At most this many matches",
            ),
        ),
        genai="search_memory",
    ),
    MemoryOperation(
        "export",
        "GET",
        f"{CONVERSATION_PATH_TEMPLATE}/export",
        "Export a conversation",
        "History",
        params=(_IF_NONE_MATCH,),
        genai="search_memory",
        answers=_NOT_MODIFIED,
    ),
    MemoryOperation(
        "info",
        "GET",
        CONVERSATION_PATH_TEMPLATE,
        "Whether a conversation exists, its version, size and remaining TTL",
        "ConversationInfo",
    ),
    MemoryOperation(
        "replace",
        "PUT",
        CONVERSATION_PATH_TEMPLATE,
        "Replace (seed) a conversation, conditional on its version",
        "ReplaceResponse",
        "ReplaceRequest",
        writes=True,
        params=(_IF_MATCH,),
        genai="upsert_memory",
        answers=_VERSION_MISMATCH,
    ),
    MemoryOperation(
        "delete",
        "DELETE",
        CONVERSATION_PATH_TEMPLATE,
        "Erase a conversation, conditional on its version",
        "DeleteResponse",
        params=(_IF_MATCH,),
        genai="delete_memory",
        answers=_VERSION_MISMATCH,
    ),
    MemoryOperation(
        "pop",
        "POST",
        f"{CONVERSATION_PATH_TEMPLATE}/pop",
        "Remove the newest entry atomically, conditional on the version; the version moves on (a write)",
        "PopResponse",
        params=(_IF_MATCH,),
        genai="update_memory",
        answers=_VERSION_MISMATCH,
    ),
    MemoryOperation(
        "rewind",
        "POST",
        f"{CONVERSATION_PATH_TEMPLATE}/rewind",
        "Drop the entries written after a version, conditional on the version; the version moves on (a write)",
        "RewindResponse",
        "RewindRequest",
        params=(_IF_MATCH,),
        genai="update_memory",
        answers=_VERSION_MISMATCH,
    ),
    MemoryOperation(
        "compact",
        "POST",
        f"{CONVERSATION_PATH_TEMPLATE}/compact",
        "Record a summary of the entries up to a version, keeping them: a read with summary=true answers it and "
        "the entries after that version; an export answers both",
        "CompactResponse",
        "CompactRequest",
        writes=True,
        genai="update_memory",
        answers={404: "The conversation holds nothing"},
    ),
    MemoryOperation(
        "fork",
        "POST",
        f"{CONVERSATION_PATH_TEMPLATE}/fork",
        "Copy the entries written at or before a version into a new conversation of the same scope and bucket",
        "ForkResponse",
        "ForkRequest",
        writes=True,
        genai="create_memory",
        answers={409: "A conversation with the new id exists already (conversation_exists)"},
    ),
    MemoryOperation(
        "list",
        "GET",
        CONVERSATIONS_PATH,
        "List the caller's conversations (the agent's own, or the end user's bucket), newest write first, "
        "with their metadata (paginated)",
        "ConversationList",
        params=(
            Parameter(
                LIMIT_PARAM,
                "query",
                {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
                "At most this many conversations per page",
            ),
            _CATALOGUE_CURSOR,
        ),
    ),
    MemoryOperation(
        "metadata",
        "PATCH",
        f"{CONVERSATION_PATH_TEMPLATE}/metadata",
        "Set a conversation's title and labels in the catalogue (a field left out is kept; null clears it)",
        "ConversationRef",
        "MetadataRequest",
        answers={404: "The catalogue lists no such conversation"},
    ),
    MemoryOperation(
        "clear",
        "DELETE",
        CONVERSATIONS_PATH,
        "Refused to every agent (403): erasing all of an agent's memory is an administrator's operation",
        None,
        params=(
            Parameter(
                "confirm",
                "query",
                {"type": "boolean", "default": False},
                "Must be true: this erases every private conversation",
            ),
        ),
    ),
    MemoryOperation(
        "erase_user",
        "DELETE",
        USER_CONVERSATIONS_PATH,
        "Erase everything of the end user the call acts for, across the agent's conversations",
        "UserErasure",
        genai="delete_memory",
    ),
)
MEMORY_OPERATION = {operation.op: operation for operation in MEMORY_OPERATIONS}

_CONVERSATIONS = f"{API_PREFIX}/conversations/"
# The router's tables, from the declarations: (method, path suffix after the id) -> op for the operations
# on one conversation, (method, path) -> op for the agent-wide ones.
_OPS = {
    (o.method, o.path[len(CONVERSATION_PATH_TEMPLATE) :].lstrip("/")): o.op
    for o in MEMORY_OPERATIONS
    if o.on_conversation
}
_SUFFIXES = tuple(dict.fromkeys(suffix for _, suffix in _OPS if suffix))
_AGENT_WIDE = {(o.method, o.path): o.op for o in MEMORY_OPERATIONS if not o.on_conversation}


def memory_target(op: str, conversation_id: str | None) -> tuple[str, str]:
    """(method, encoded path) of a memory operation (``conversation_id`` None for an agent-wide one): the
    path is built from the decoded id, so an id that needed percent-encoding reaches the same key behind
    the launcher as in front of it."""
    operation = MEMORY_OPERATION[op]
    if conversation_id is None:
        return operation.method, operation.path
    return operation.method, operation.path.replace(CONVERSATION_ID_TEMPLATE, _segment(conversation_id))


def memory_route(method: str, path: str) -> tuple[str, str | None]:
    """(operation, conversation id or None for agent-wide operations) for a memory path; raises NotFound
    for anything else. The id is whatever sits between the prefix and the suffix, so a '/' inside it is
    caught by the id rule (400)."""
    agent_wide = _AGENT_WIDE.get((method, path))
    if agent_wide is not None:
        return agent_wide, None
    if not path.startswith(_CONVERSATIONS):
        raise NotFound(f"no route {path}")
    rest = path[len(_CONVERSATIONS) :]
    for suffix in _SUFFIXES:
        if rest.endswith("/" + suffix):
            op = _OPS.get((method, suffix))
            if op is None:
                break
            return op, rest[: -len(suffix) - 1]
    op = _OPS.get((method, ""))
    if op is None:
        raise NotFound(f"no route {method} {path}")
    return op, rest


# The id of a rolling-summary entry starts with this (the launcher writes it, the proxy replays it).
SUMMARY_ID_PREFIX = "summary-"
