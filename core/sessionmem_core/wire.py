"""Wire models and HTTP names shared by the proxy, the launcher and clients.

The proxy and the launcher serve the same memory API (same paths, same bodies), so an agent can talk to
either; only the launcher is reachable from the agent's pod, on 127.0.0.1.
"""

from __future__ import annotations

from enum import StrEnum
from urllib.parse import quote
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sessionmem_core import env
from sessionmem_core.errors import NotFound
from sessionmem_core.ids import validate_message_id

API_PREFIX = "/v1"

# Query parameters a write takes besides ``scope``: how many entries to keep and the TTL it refreshes.
CAP_PARAM = "cap"
TTL_PARAM = "ttlSeconds"
SCOPE_PARAM = "scope"
REDACT_PARAM = "redact"
LIMIT_PARAM = "limit"

# Response headers that repeat what a memory response says, so the launcher can trace it unparsed.
VERSION_HEADER = "x-sessionmem-version"
ENTRIES_HEADER = "x-sessionmem-entries"
SCOPE_HEADER = "x-sessionmem-scope"
# Set by the managed loop on its answer: "ok", "unavailable" (answered without context) or "not-stored".
MEMORY_STATUS_HEADER = "x-sessionmem-memory"

# Headers.
CONVERSATION_ID_HEADER = "x-conversation-id"
USER_CAPABILITY_HEADER = "x-sessionmem-user-capability"
TRACEPARENT_HEADER = "traceparent"
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


def _segment(conversation_id: str) -> str:
    # Percent-encoded: a valid id may hold '#', '?' or '%', which a URL would otherwise read as syntax.
    return quote(conversation_id, safe="")


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


_CONVERSATIONS = f"{API_PREFIX}/conversations/"
_OPS = {
    ("GET", "entries"): "get",
    ("POST", "entries"): "append",
    ("GET", "search"): "search",
    ("GET", "export"): "export",
    ("GET", ""): "info",
    ("PUT", ""): "replace",
    ("DELETE", ""): "delete",
}
_SUFFIXES = ("entries", "search", "export")


_PATH_OF_OP = {
    "get": entries_path,
    "append": entries_path,
    "search": search_path,
    "export": export_path,
    "info": conversation_path,
    "replace": conversation_path,
    "delete": conversation_path,
}


def memory_path(op: str, conversation_id: str | None, path: str) -> str:
    """The (encoded) path to forward an operation to: rebuilt from the decoded id, so an id that needed
    percent-encoding reaches the same key behind the launcher as in front of it."""
    return path if conversation_id is None else _PATH_OF_OP[op](conversation_id)


_AGENT_WIDE = {
    ("GET", CONVERSATIONS_PATH): "list",
    ("DELETE", CONVERSATIONS_PATH): "clear",
    ("DELETE", USER_CONVERSATIONS_PATH): "erase_user",
}


def memory_route(method: str, path: str) -> tuple[str, str | None]:
    """(operation, conversation id or None for agent-wide operations) for a memory path; raises NotFound
    for anything else. The id is whatever sits between the prefix and the suffix, so a '/' inside it is
    caught by the id rule (400)."""
    agent_wide = _AGENT_WIDE.get((method, path.rstrip("/")))
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


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"


MessageId = Annotated[str, AfterValidator(validate_message_id)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class EntryIn(_Model):
    """One message to store. Its author is stamped by the proxy from the caller's identity."""

    role: Role
    content: str = Field(max_length=env.MAX_CONTENT_CHARS)
    id: MessageId | None = Field(
        default=None, description="Client message id; an append retried with the same ids is stored once."
    )


class AppendRequest(_Model):
    entries: list[EntryIn] = Field(min_length=1, max_length=env.MAX_ENTRIES_PER_APPEND)


class AppendResponse(_Model):
    version: int = Field(description="Conversation version after the append: +1 per append, also past the cap.")
    stored: int = Field(description="Entries stored by this call (0 when it was a retry).")
    duplicate: bool = Field(description="True when these message ids were already stored.")
    scope: str
    length: int = Field(description="Entries the conversation holds after this append.")


class Entry(_Model):
    id: str
    v: int = Field(description="The conversation version this entry was written at.")
    role: Role
    content: str
    author: str = Field(description="namespace/agent of the authenticated writer, stamped server-side.")
    ts: int = Field(description="Unix time in milliseconds, set by the server.")


class History(_Model):
    conversation_id: str = Field(alias="conversationId")
    scope: str
    version: int
    entries: list[Entry]
    summary: Entry | None = Field(
        default=None, description="With summary=true: the rolling summary of older turns, if there is one."
    )


class ConversationInfo(_Model):
    conversation_id: str = Field(alias="conversationId")
    scope: str
    exists: bool
    version: int
    entries: int
    ttl_seconds: int | None = Field(alias="ttlSeconds", description="Seconds until it expires; None if absent.")


class ConversationRef(_Model):
    conversation_id: str = Field(alias="conversationId")


class ConversationList(_Model):
    conversations: list[ConversationRef]
    next_cursor: str | None = Field(alias="nextCursor", description="Pass as cursor for the next page; None: done.")


class ClearResponse(_Model):
    conversations: int = Field(description="How many conversations were removed.")
    entries: int = Field(description="How many entries they held.")


class UserErasure(_Model):
    conversations: list[str] = Field(description="Ids of the end user's conversations that were removed.")
    entries: int


class ReplaceRequest(_Model):
    entries: list[EntryIn] = Field(min_length=1, max_length=env.MAX_CAP)


class ReplaceResponse(_Model):
    version: int
    stored: int
    scope: str


class DeleteResponse(_Model):
    deleted: bool
    entries: int = Field(description="How many entries were removed.")
    scope: str


class SearchResponse(_Model):
    conversation_id: str = Field(alias="conversationId")
    scope: str
    query: str
    matches: list[Entry]


class ErrorDetail(_Model):
    type: str
    message: str


class ErrorResponse(_Model):
    error: ErrorDetail


class Health(_Model):
    status: str
