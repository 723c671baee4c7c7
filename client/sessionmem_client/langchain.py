"""LangChain adapter: a ``BaseChatMessageHistory`` kept in sessionmem.

    from langchain_core.runnables.history import RunnableWithMessageHistory
    from sessionmem_client import MemoryClient
    from sessionmem_client.langchain import SessionmemChatMessageHistory

    memory = MemoryClient()
    chain_with_memory = RunnableWithMessageHistory(
        chain, lambda conversation_id: SessionmemChatMessageHistory(conversation_id, memory), ...
    )

What is stored: every message as given, one entry per message: its ``message_to_dict`` form (the entry's
``item``: type, content and content blocks, ``id``, ``name``, ``tool_calls``, ``tool_call_id``,
``additional_kwargs``, ``response_metadata``, ``usage_metadata``), its role (``user``, ``assistant``,
``system``, ``tool``, ``function``, or a ``ChatMessage``'s own role) and its text. ``messages`` returns
every message (not a window) equal to what was added, tool traffic and empty messages included.

Each ``add_messages`` call is one atomic append per 64 messages, sent with an ``Idempotency-Key`` of its
own: the client's retries (of a 429 or a dropped connection) store it once, whatever the message ids.

Beside ``BaseChatMessageHistory`` it answers what langchain-redis's ``RedisChatMessageHistory`` adds:
``session_id``/``id``, ``search_messages`` (the conversation's keyword search), ``len()`` and ``delete``.
Retention is the agent's (``spec.sessionMemory``'s TTL, refreshed on every write), not a history's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from sessionmem_client._requests import MAX_SEARCH_LIMIT, EntryFields
from sessionmem_client.client import AsyncMemoryClient, MemoryClient
from sessionmem_core import env, wire
from sessionmem_core.keys import new_message_id, validate_conversation_id

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        HumanMessage,
        SystemMessage,
        message_to_dict,
        messages_from_dict,
    )
    from langchain_core.runnables.config import run_in_executor
except ImportError as exc:  # pragma: no cover - exercised only without langchain-core
    raise ImportError("sessionmem_client.langchain needs langchain-core: pip install langchain-core") from exc

__all__ = ["SessionmemChatMessageHistory", "entry_to_message", "message_to_entry"]

_ROLE = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]{0,63}$")
# A message's type -> the entry's role (the chat roles the managed loop and search know).
_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "function"}


def _role(message: BaseMessage) -> str:
    if isinstance(message, ChatMessage) and _ROLE.match(message.role):
        return message.role
    role = _ROLES.get(message.type.removesuffix("Chunk").lower().removesuffix("message"), message.type)
    return role if _ROLE.match(role) else "message"


def message_to_entry(message: BaseMessage) -> EntryFields:
    """The entry a message is stored as: its dict form, its role and its text."""
    return {
        "role": _role(message),
        "content": str(message.text)[: env.MAX_CONTENT_CHARS],
        "item": message_to_dict(message),
    }


def entry_to_message(entry: Mapping[str, Any]) -> BaseMessage:
    """The message an entry holds; an entry written without one (by an older client, or the managed loop)
    reads as a message of its role and text, with the entry's id."""
    item = entry.get("item")
    if isinstance(item, dict) and "type" in item and "data" in item:
        return messages_from_dict([item])[0]
    role, content, entry_id = entry["role"], entry["content"], entry.get("id")
    if role == "user":
        return HumanMessage(content=content, id=entry_id)
    if role == "assistant":
        return AIMessage(content=content, id=entry_id)
    if role == "system":
        return SystemMessage(content=content, id=entry_id)
    return ChatMessage(role=role, content=content, id=entry_id)


def _messages_of(entries: list[dict[str, Any]]) -> list[BaseMessage]:
    """``entry_to_message`` of each entry; the items of a history written by this adapter (all of them
    carry one) converted by one ``messages_from_dict`` call, as LangChain's own histories do."""
    items = [entry.get("item") for entry in entries]
    if all(isinstance(item, dict) and "type" in item and "data" in item for item in items):
        return messages_from_dict(items)  # type: ignore[arg-type]  # checked just above
    return [entry_to_message(entry) for entry in entries]


def _batches(messages: Sequence[BaseMessage]) -> list[tuple[list[EntryFields], str]]:
    """The appends of one ``add_messages`` call and their idempotency keys."""
    entries = [message_to_entry(m) for m in messages]
    key, size = new_message_id(), env.MAX_ENTRIES_PER_APPEND
    return [(entries[i : i + size], f"{key}.{n}") for n, i in enumerate(range(0, len(entries), size))]


def _found(answer: wire.SearchResponse) -> list[dict[str, Any]]:
    """A search's matches as dicts: each entry's fields as the wire names them."""
    return [entry.model_dump(mode="json", by_alias=True, exclude_none=True) for entry in answer.matches]


class SessionmemChatMessageHistory(BaseChatMessageHistory):
    """The chat history of one conversation, stored by sessionmem.

    ``client`` serves the sync methods, ``async_client`` the async ones (``aget_messages``,
    ``aadd_messages``, ``aclear``); give either or both. Without an async client the async methods run
    the sync ones in an executor (LangChain's default); without a sync client the sync methods raise.
    With neither, a :class:`MemoryClient` for the pod's launcher is made (and owned: see :meth:`close`).
    ``window``: how many of the latest messages ``messages`` returns (None, the default: all).
    """

    def __init__(
        self,
        conversation_id: str,
        client: MemoryClient | None = None,
        *,
        async_client: AsyncMemoryClient | None = None,
        window: int | None = None,
    ) -> None:
        super().__init__()
        self.conversation_id = validate_conversation_id(conversation_id)
        self._owned: MemoryClient | None = None
        if client is None and async_client is None:
            client = self._owned = MemoryClient()
        self._client = client
        self._async_client = async_client
        self.window = window

    @property
    def session_id(self) -> str:
        """The conversation id (the ``session_id`` ``RunnableWithMessageHistory`` passes its factory)."""
        return self.conversation_id

    @property
    def id(self) -> str:
        """The conversation id, as langchain-redis's history names it."""
        return self.conversation_id

    def _sync(self) -> MemoryClient:
        if self._client is None:
            raise RuntimeError("this history has only an async client: use aget_messages/aadd_messages/aclear")
        return self._client

    def _window(self) -> int | None:
        return None if self.window is None or self.window > env.MAX_READ_LIMIT else self.window

    def _select(self, messages: list[BaseMessage]) -> list[BaseMessage]:
        if self.window is not None:
            return messages[-self.window :] if self.window else []
        return messages

    @property
    def messages(self) -> list[BaseMessage]:
        """Every message (the latest ``window`` when set), oldest first, as added (one read). A new list
        each time; while the conversation is unchanged (a 304), of the message objects the last read gave,
        as LangChain's in-memory history gives its own: change a copy, not them."""
        return self._select(self._sync()._read_converted(self.conversation_id, self._window(), _messages_of)[0])

    @messages.setter
    def messages(self, messages: Sequence[BaseMessage]) -> None:
        """Assigning replaces the stored history with these messages (clears it when there are none)."""
        if messages:
            self._sync().replace(self.conversation_id, [message_to_entry(m) for m in messages])
        else:
            self._sync().delete(self.conversation_id)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        for batch, key in _batches(messages):
            self._sync()._append_batch(self.conversation_id, batch, key)

    def clear(self) -> None:
        self._sync().delete(self.conversation_id)

    async def aget_messages(self) -> list[BaseMessage]:
        if self._async_client is None:
            return await super().aget_messages()
        return self._select(
            (await self._async_client._read_converted(self.conversation_id, self._window(), _messages_of))[0]
        )

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if self._async_client is None:
            await super().aadd_messages(messages)
            return
        for batch, key in _batches(messages):
            await self._async_client._append_batch(self.conversation_id, batch, key)

    async def aclear(self) -> None:
        if self._async_client is None:
            await super().aclear()
            return
        await self._async_client.delete(self.conversation_id)

    def delete(self) -> None:
        """Erase the conversation: :meth:`clear`, under langchain-redis's name for it."""
        self.clear()

    def search_messages(self, query: str, limit: int = 10) -> list[dict[str, Any]]:
        """The stored messages whose text holds ``query``'s words: the conversation's keyword search
        (case-insensitive, entries with more of the words first, newest first on ties), at most ``limit``
        of them (the server answers at most ``MAX_SEARCH_LIMIT``). Each is the entry's fields: ``content``
        (the message's text), ``role``, ``item`` (its dict form: ``entry_to_message`` gives the message
        back), ``id``, ``v``, ``ts``. An empty query or a ``limit`` below 1 finds nothing, without a call."""
        if not query or limit < 1:
            return []
        return _found(self._sync().search(self.conversation_id, query, min(limit, MAX_SEARCH_LIMIT)))

    async def asearch_messages(self, query: str, limit: int = 10) -> list[dict[str, Any]]:
        """:meth:`search_messages` on the async client (the sync one in an executor without it)."""
        if self._async_client is None:
            return await run_in_executor(None, self.search_messages, query, limit)
        if not query or limit < 1:
            return []
        return _found(await self._async_client.search(self.conversation_id, query, min(limit, MAX_SEARCH_LIMIT)))

    def __len__(self) -> int:
        """How many messages ``messages`` returns, from the conversation's entry count (nothing is read)."""
        entries = self._sync().info(self.conversation_id).entries
        return entries if self.window is None else min(entries, self.window)

    def __bool__(self) -> bool:
        """A history is true whatever it holds: ``if history:`` makes no call."""
        return True

    def close(self) -> None:
        """Close the client this history made itself (clients passed in are the caller's to close)."""
        if self._owned is not None:
            self._owned.close()

    def __eq__(self, other: object) -> bool:
        """Equal to any chat history holding equal messages, as LangChain's own histories compare (one read
        of each)."""
        if not isinstance(other, BaseChatMessageHistory):
            return NotImplemented
        return self.messages == other.messages

    __hash__ = None  # type: ignore[assignment]  # equal by what it holds, which changes

    def __repr__(self) -> str:
        return f"SessionmemChatMessageHistory(conversation_id={self.conversation_id!r})"
