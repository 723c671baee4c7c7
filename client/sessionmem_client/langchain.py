"""LangChain adapter: a ``BaseChatMessageHistory`` kept in sessionmem.

    from langchain_core.runnables.history import RunnableWithMessageHistory
    from sessionmem_client import MemoryClient
    from sessionmem_client.langchain import SessionmemChatMessageHistory

    memory = MemoryClient()
    chain_with_memory = RunnableWithMessageHistory(
        chain, lambda conversation_id: SessionmemChatMessageHistory(conversation_id, memory), ...
    )

What is stored: ``HumanMessage`` -> ``user``, ``AIMessage`` -> ``assistant``, ``SystemMessage`` -> ``system``
(and a ``ChatMessage`` whose role is one of those). Tool traffic is skipped: ``ToolMessage`` and
``FunctionMessage``, and an ``AIMessage`` that carries tool calls (the model's intermediate step, whose
final answer comes in a later ``AIMessage``). sessionmem keeps the clean {user, assistant} exchange, never
tool-call scratch; replaying a tool call without its result would also make most chat models reject the
history. Messages are stored as their text (``message.text``); a message without text is skipped. A
message's ``id`` is kept as the entry id when it satisfies the id rule, so an ``add_messages`` retried
with the same messages is stored once; messages read back carry their entry ids.

Each ``add_messages`` call is one atomic append (up to 64 messages; a larger batch is split into atomic
appends of 64).
"""

from __future__ import annotations

from collections.abc import Sequence

from sessionmem_client._requests import EntryFields, WindowEntry, new_entry
from sessionmem_client.client import AsyncMemoryClient, MemoryClient
from sessionmem_core import env, wire
from sessionmem_core.ids import is_valid_id, validate_conversation_id

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        FunctionMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
except ImportError as exc:  # pragma: no cover - exercised only without langchain-core
    raise ImportError("sessionmem_client.langchain needs langchain-core: pip install langchain-core") from exc

__all__ = ["SessionmemChatMessageHistory", "entry_to_message", "message_to_entry"]

_CHAT_ROLES = {
    "user": wire.Role.USER,
    "human": wire.Role.USER,
    "assistant": wire.Role.ASSISTANT,
    "ai": wire.Role.ASSISTANT,
    "system": wire.Role.SYSTEM,
}


def _role(message: BaseMessage) -> wire.Role | None:
    if isinstance(message, (ToolMessage, FunctionMessage)):
        return None
    if isinstance(message, HumanMessage):
        return wire.Role.USER
    if isinstance(message, AIMessage):
        return None if message.tool_calls else wire.Role.ASSISTANT
    if isinstance(message, SystemMessage):
        return wire.Role.SYSTEM
    if isinstance(message, ChatMessage):
        return _CHAT_ROLES.get(message.role.lower())
    return None


def message_to_entry(message: BaseMessage) -> wire.EntryIn | None:
    """The entry a message is stored as, or None for a message that is not stored (see the module doc);
    :class:`~sessionmem_core.errors.InvalidRequest` for a message the contract refuses (too long)."""
    stored = _stored_as(message)
    return None if stored is None else new_entry(*stored)


def _stored_as(message: BaseMessage) -> tuple[wire.Role, str, str | None] | None:
    """The role, text and id a message is stored with, or None (what :func:`message_to_entry` maps)."""
    role = _role(message)
    if role is None:
        return None
    text = str(message.text)
    if not text:
        return None
    return role, text, message.id if message.id and is_valid_id(message.id) else None


def entry_to_message(entry: wire.Entry) -> BaseMessage:
    return _message(entry.role, entry.content, entry.id)


def _message(role: str, content: str, entry_id: str) -> BaseMessage:
    if role == wire.Role.USER:
        return HumanMessage(content=content, id=entry_id)
    if role == wire.Role.ASSISTANT:
        return AIMessage(content=content, id=entry_id)
    return SystemMessage(content=content, id=entry_id)


def _messages(window: list[WindowEntry]) -> list[BaseMessage]:
    return [_message(e["role"], e["content"], e["id"]) for e in window]


def _fields(role: wire.Role, text: str, entry_id: str | None) -> EntryFields:
    fields: EntryFields = {"role": role.value, "content": text}
    if entry_id is not None:
        fields["id"] = entry_id
    return fields


def _batches(messages: Sequence[BaseMessage]) -> list[list[EntryFields]]:
    """The appends of ``add_messages``, checked by the server: a message it refuses (too long) raises its
    InvalidRequest, and nothing of that batch is stored."""
    entries = [_fields(*stored) for stored in (_stored_as(m) for m in messages) if stored is not None]
    size = env.MAX_ENTRIES_PER_APPEND
    return [entries[i : i + size] for i in range(0, len(entries), size)]


class SessionmemChatMessageHistory(BaseChatMessageHistory):
    """The chat history of one conversation, stored by sessionmem.

    ``client`` serves the sync methods, ``async_client`` the async ones (``aget_messages``,
    ``aadd_messages``, ``aclear``); give either or both. Without an async client the async methods run
    the sync ones in an executor (LangChain's default); without a sync client the sync methods raise.
    With neither, a :class:`MemoryClient` for the pod's launcher is made (and owned: see :meth:`close`).
    ``window``: how many of the latest entries ``messages`` returns (default 40, the replay window).
    ``include_summary``: put the conversation's rolling summary, when there is one, first.
    """

    def __init__(
        self,
        conversation_id: str,
        client: MemoryClient | None = None,
        *,
        async_client: AsyncMemoryClient | None = None,
        window: int = env.DEFAULT_REPLAY_MESSAGES,
        include_summary: bool = False,
    ) -> None:
        super().__init__()
        self.conversation_id = validate_conversation_id(conversation_id)
        self._owned: MemoryClient | None = None
        if client is None and async_client is None:
            client = self._owned = MemoryClient()
        self._client = client
        self._async_client = async_client
        self.window = window
        self.include_summary = include_summary

    def _sync(self) -> MemoryClient:
        if self._client is None:
            raise RuntimeError("this history has only an async client: use aget_messages/aadd_messages/aclear")
        return self._client

    @property
    def messages(self) -> list[BaseMessage]:
        """The latest ``window`` messages, oldest first (one read)."""
        return _messages(self._sync()._read_window(self.conversation_id, self.window, self.include_summary))

    @messages.setter
    def messages(self, messages: Sequence[BaseMessage]) -> None:
        """Assigning replaces the stored history with these messages (clears it when none is stored)."""
        entries = [e for e in (message_to_entry(m) for m in messages) if e is not None]
        if entries:
            self._sync().replace(self.conversation_id, entries)
        else:
            self._sync().delete(self.conversation_id)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        for batch in _batches(messages):
            self._sync()._append_batch(self.conversation_id, batch)

    def clear(self) -> None:
        self._sync().delete(self.conversation_id)

    async def aget_messages(self) -> list[BaseMessage]:
        if self._async_client is None:
            return await super().aget_messages()
        return _messages(await self._async_client._read_window(self.conversation_id, self.window, self.include_summary))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if self._async_client is None:
            await super().aadd_messages(messages)
            return
        for batch in _batches(messages):
            await self._async_client._append_batch(self.conversation_id, batch)

    async def aclear(self) -> None:
        if self._async_client is None:
            await super().aclear()
            return
        await self._async_client.delete(self.conversation_id)

    def close(self) -> None:
        """Close the client this history made itself (clients passed in are the caller's to close)."""
        if self._owned is not None:
            self._owned.close()

    def __repr__(self) -> str:
        return f"SessionmemChatMessageHistory(conversation_id={self.conversation_id!r})"
