"""Wire models (pydantic) of the memory API, shared by the proxy and clients; its paths and headers are
in ``sessionmem_core.api``.

The proxy and the launcher serve the same memory API (same paths, same bodies), so an agent can talk to
either; only the launcher is reachable from the agent's pod, on 127.0.0.1.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sessionmem_core import env
from sessionmem_core.keys import validate_message_id


class Role(StrEnum):
    """The roles of a clean exchange (what the managed loop writes and replays). An entry's role is an
    open string (``EntryRole``): these, or ``developer``, ``tool`` or a framework's item type."""

    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"


# An entry's role: a chat role or a framework's item type (``function_call``) for items with no role.
EntryRole = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9_.:-]*$")]
# The caller's idempotency key of one append (the ``Idempotency-Key`` header; ``api.IDEMPOTENCY_KEY``).
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]


MessageId = Annotated[str, AfterValidator(validate_message_id)]


class _Model(BaseModel):
    # Responses ignore fields they do not know, so a newer server does not break an older client.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _Request(BaseModel):
    # Requests refuse unknown fields: a typo in a body is a 400, not silently dropped.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class EntryIn(_Request):
    """One entry to store: its text (``content``, what search, token budgets and summaries use) and,
    optionally, the framework's item as given (``item``), stored and answered unchanged. Its author is
    stamped by the proxy from the caller's identity."""

    role: EntryRole
    content: str = Field(
        max_length=env.MAX_CONTENT_CHARS, description="The entry's text, extracted once by the writer; may be ''."
    )
    id: MessageId | None = Field(
        default=None,
        description="Client message id, kept as given (it may repeat). Without an Idempotency-Key header, an "
        "append retried with the same ids is stored once.",
    )
    item: dict[str, Any] | None = Field(
        default=None,
        description="The framework's item as given (any JSON object): stored and returned unchanged, key order "
        f"kept. At most {env.MAX_ITEM_BYTES} bytes stored.",
    )


class AppendRequest(_Request):
    entries: list[EntryIn] = Field(min_length=1, max_length=env.MAX_ENTRIES_PER_APPEND)


class AppendResponse(_Model):
    version: int = Field(description="Conversation version after the append: +1 per append, also past the cap.")
    stored: int = Field(description="Entries stored by this call (0 when it was a retry).")
    duplicate: bool = Field(description="True when nothing new was stored: every message id was already stored.")
    scope: str
    length: int = Field(description="Entries the conversation holds after this append.")
    duplicate_ids: list[str] = Field(
        default_factory=list,
        alias="duplicateIds",
        description="Ids of entries not stored by this call: already stored (a retry), or repeated in the batch.",
    )
    entries: list[Entry] | None = Field(
        default=None,
        description="With Prefer: return=representation, when the whole batch was stored: its entries as a read "
        "answers them (the ETag header is then the conversation's right after this append).",
    )


class Entry(_Model):
    id: str
    v: int = Field(description="The conversation version this entry was written at.")
    idempotency_key: str | None = Field(
        default=None,
        alias="idempotencyKey",
        description="On the first entry of an append sent with an Idempotency-Key: that key.",
    )
    rewound_at: int | None = Field(
        default=None,
        alias="rewoundAt",
        description="On the newest entry after a pop or rewind: the version that write gave the conversation.",
    )
    life: str | None = Field(
        default=None,
        description="On the newest entry of each write: the id of the conversation's life (new each time it is "
        "created), which its ETag is made of.",
    )
    role: str
    content: str
    author: str = Field(description="namespace/agent of the authenticated writer, stamped server-side.")
    ts: int = Field(description="Unix time in milliseconds, set by the server.")
    item: dict[str, Any] | None = Field(default=None, description="The item as the writer gave it, if one was.")


class History(_Model):
    conversation_id: str = Field(alias="conversationId")
    scope: str
    version: int
    entries: list[Entry]
    summary: Entry | None = Field(
        default=None,
        description="With summary=true, and on an export's first page: the conversation's summary, if there is "
        "one (a compaction's: its v is the version it covers through; entries then start after it).",
    )
    next_offset: int | None = Field(
        default=None,
        alias="nextOffset",
        description="Exports from the proxy, which pages them: the offset of the next page; None on the last.",
    )


class ConversationInfo(_Model):
    conversation_id: str = Field(alias="conversationId")
    scope: str
    exists: bool
    version: int
    entries: int
    ttl_seconds: int | None = Field(alias="ttlSeconds", description="Seconds until it expires; None if absent.")


class ConversationRef(_Model):
    """A conversation as the catalogue lists it."""

    conversation_id: str = Field(alias="conversationId")
    title: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    created: int | None = Field(default=None, description="Unix ms of its first write (as the catalogue saw it).")
    updated: int | None = Field(default=None, description="Unix ms of its last write.")
    entries: int | None = Field(default=None, description="Entries it holds.")
    bucket: str | None = Field(default=None, description="The end user's bucket it lives in (perUser agents).")


LabelName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")]


class MetadataRequest(_Request):
    title: str | None = Field(default=None, max_length=256)
    labels: dict[LabelName, Annotated[str, Field(max_length=256)]] | None = Field(default=None, max_length=32)


class ConversationList(_Model):
    conversations: list[ConversationRef]
    next_cursor: str | None = Field(alias="nextCursor", description="Pass as cursor for the next page; None: done.")


class ClearResponse(_Model):
    conversations: int = Field(description="How many conversations were removed.")
    entries: int = Field(description="How many entries they held.")


class UserErasure(_Model):
    conversations: list[str] = Field(description="Ids of the end user's conversations that were removed.")
    entries: int
    dataKeysDestroyed: list[str] | None = Field(  # noqa: N815
        default=None,
        description="With encryption at rest: the data keys destroyed (one per agent, user bucket or registry), "
        "which leaves what they sealed unreadable in every copy of the stored data (AOF, snapshots, replicas, "
        "backups). Null when the proxy does not encrypt at rest.",
    )


class ErasureReceipt(_Model):
    """What an administrator's erasure removed, and on whose authority."""

    namespace: str
    agent: str
    user: str | None = Field(default=None, description="The end user whose memory was erased, if only theirs.")
    registry: str | None = Field(default=None, description="The AgentRegistry whose shared memory was erased.")
    keys: list[str] = Field(description="The Valkey keys removed.")
    entries: int = Field(description="How many entries they held.")
    erasedBy: str = Field(description="The Kubernetes user the API server vouched for.")  # noqa: N815
    dataKeysDestroyed: list[str] | None = Field(  # noqa: N815
        default=None,
        description="With encryption at rest: the data keys destroyed (one per agent, user bucket or registry), "
        "which leaves what they sealed unreadable in every copy of the stored data (AOF, snapshots, replicas, "
        "backups). Null when the proxy does not encrypt at rest.",
    )


class AdminConversation(_Model):
    """One conversation of an agent, as an administrator lists it."""

    conversation_id: str = Field(alias="conversationId")
    bucket: str | None = Field(default=None, description="The end user's bucket it lives in (perUser agents).")
    entries: int
    version: int
    ttl_seconds: int | None = Field(alias="ttlSeconds", description="Seconds until it expires; None if gone.")
    newest_ts: int | None = Field(
        default=None, alias="newestTs", description="Unix ms of its newest entry (its last write)."
    )


class AdminConversationList(_Model):
    namespace: str
    agent: str
    user: str | None = Field(default=None, description="The end user whose bucket was listed, if one was named.")
    conversations: list[AdminConversation]
    next_cursor: str | None = Field(alias="nextCursor", description="Pass as cursor for the next page; None: done.")


class Transcript(_Model):
    """One conversation's entries (authors and times stamped by the proxy), oldest first."""

    namespace: str
    agent: str
    conversation_id: str = Field(alias="conversationId")
    bucket: str | None = None
    version: int
    total: int = Field(description="Entries the conversation holds; ``entries`` may be only the newest of them.")
    ttl_seconds: int | None = Field(alias="ttlSeconds")
    entries: list[Entry]


class AgentMemoryStats(_Model):
    """What one agent's memory holds against its quota."""

    namespace: str
    agent: str
    conversations: int = Field(description="Conversations counted by the storage accounting (buckets included).")
    bytes: int = Field(description="Bytes of stored entries counted by the storage accounting.")
    quota_conversations: int | None = Field(alias="quotaConversations")
    quota_bytes: int | None = Field(alias="quotaBytes")
    per_user: bool | None = Field(alias="perUser", description="spec.sessionMemory.perUser as the proxy reads it.")
    oldest_write_ts: int | None = Field(
        alias="oldestWriteTs", description="Unix ms of the oldest entry still stored among the examined ones."
    )
    newest_write_ts: int | None = Field(alias="newestWriteTs", description="Unix ms of the newest write examined.")
    examined: int = Field(description="Conversations whose entries were read for the write times.")
    complete: bool = Field(description="False when there were more conversations than the examination bound.")


class ReplaceRequest(_Request):
    entries: list[EntryIn] = Field(min_length=1, max_length=env.MAX_CAP)


class ReplaceResponse(_Model):
    version: int
    stored: int
    scope: str


class DeleteResponse(_Model):
    deleted: bool
    entries: int = Field(description="How many entries were removed.")
    scope: str


class PopResponse(_Model):
    entry: Entry | None = Field(description="The entry removed; None when the conversation held none.")
    version: int = Field(description="The version after the pop (it moves on; 0 once nothing is left).")
    length: int
    scope: str


class RewindRequest(_Request):
    to_version: int = Field(alias="toVersion", ge=0, description="Keep the entries written at or before it.")


class RewindResponse(_Model):
    version: int = Field(description="The version after the rewind (it moves on; 0 once nothing is left).")
    removed: int
    length: int
    scope: str


class CompactRequest(_Request):
    summary: EntryIn
    through_version: int = Field(
        alias="throughVersion", ge=0, description="The summary covers the entries written at or before it."
    )


class CompactResponse(_Model):
    version: int = Field(description="The conversation's version (a compaction adds no entry).")
    scope: str


class ForkRequest(_Request):
    conversation_id: str = Field(alias="conversationId", min_length=1, max_length=128, description="The new id.")
    at_version: int | None = Field(
        default=None, alias="atVersion", ge=0, description="Copy the entries written at or before it; None: all."
    )


class ForkResponse(_Model):
    conversation_id: str = Field(alias="conversationId")
    version: int = Field(description="The new conversation's version: that of its newest entry.")
    entries: int = Field(description="Entries copied.")
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
