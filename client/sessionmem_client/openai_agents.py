"""OpenAI Agents SDK adapter: a ``Session`` (the SDK's ``agents.memory.Session`` protocol) kept in sessionmem.

    from agents import Agent, Runner
    from sessionmem_client import AsyncMemoryClient
    from sessionmem_client.openai_agents import SessionmemSession

    memory = AsyncMemoryClient()
    result = await Runner.run(agent, "Hi", session=SessionmemSession(conversation_id, memory))

What is stored: message items only, as text. ``{"role": "user", "content": ...}`` -> ``user``;
``assistant`` messages (easy input messages, and the model's output messages with ``output_text`` /
``refusal`` parts) -> ``assistant``; ``system`` and ``developer`` messages -> ``system``. A list content keeps
its text parts (``input_text``/``output_text``/``refusal``); images, files and audio are dropped, and a message
left without text is skipped. Every other item is skipped, not stored as text: function/tool calls and
their outputs, reasoning, hosted-tool calls, handoffs, MCP items, and assistant ``commentary`` (phase)
messages. sessionmem keeps the clean {user, assistant} exchange, never tool-call scratch; and a tool call
replayed without its output (or the reverse) makes the Responses API reject the input, so storing only
half of them, or a textual stand-in, would break the next turn. Items read back are easy input messages
``{"role": ..., "content": "..."}``.

Item ids are not kept as entry ids: the store treats a batch whose first id is already stored as a retry
and drops it, and several model back-ends reuse one placeholder id for every message (the Runner already
tracks which items it saved).

``pop_item`` reads the whole conversation (export) and replaces it without its last entry, conditional on
the version it read (``If-Match``), re-reading and retrying when another writer got there first; so it never
erases a concurrent append. Popping the only entry deletes the conversation, which the memory API cannot
make conditional.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from sessionmem_client._requests import EntryFields, new_entry
from sessionmem_client.client import AsyncMemoryClient
from sessionmem_core import env, wire
from sessionmem_core.errors import VersionConflict
from sessionmem_core.ids import validate_conversation_id

try:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from openai.types.responses import EasyInputMessageParam
except ImportError as exc:  # pragma: no cover - exercised only without openai-agents
    raise ImportError("sessionmem_client.openai_agents needs the OpenAI Agents SDK: pip install openai-agents") from exc

__all__ = ["SessionmemSession", "entry_to_item", "item_to_entry"]

_ROLES = {
    "user": wire.Role.USER,
    "assistant": wire.Role.ASSISTANT,
    "system": wire.Role.SYSTEM,
    "developer": wire.Role.SYSTEM,
}
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
_ITEM_ROLES: dict[wire.Role, Literal["user", "assistant", "system"]] = {
    wire.Role.USER: "user",
    wire.Role.ASSISTANT: "assistant",
    wire.Role.SYSTEM: "system",
}
_POP_ATTEMPTS = 5


def _as_mapping(item: object) -> Mapping[str, Any] | None:
    if isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)  # an SDK/openai pydantic model instead of its dict form
    if callable(dump):
        data = dump(exclude_unset=True)
        return data if isinstance(data, Mapping) else None
    return None


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        return ""
    texts: list[str] = []
    for part in content:
        data = _as_mapping(part)
        field = _TEXT_PARTS.get(str(data.get("type"))) if data is not None else None
        if data is not None and field is not None and isinstance(data.get(field), str):
            texts.append(data[field])
    return "".join(texts)


def item_to_entry(item: TResponseInputItem | Mapping[str, Any]) -> wire.EntryIn | None:
    """The entry an SDK item is stored as, or None for an item that is not stored (see the module doc);
    :class:`~sessionmem_core.errors.InvalidRequest` for an item the contract refuses (too long)."""
    stored = _stored_as(item)
    return None if stored is None else new_entry(*stored)


def _stored_as(item: object) -> tuple[wire.Role, str] | None:
    """The role and text an item is stored with, or None (what :func:`item_to_entry` maps)."""
    data = _as_mapping(item)
    if data is None or data.get("type", "message") != "message":
        return None
    role = _ROLES.get(str(data.get("role")))
    if role is None or (role is wire.Role.ASSISTANT and data.get("phase") == "commentary"):
        return None
    text = _text(data.get("content"))
    if not text:
        return None
    return role, text


def entry_to_item(entry: wire.Entry) -> TResponseInputItem:
    item: EasyInputMessageParam = {"role": _ITEM_ROLES[wire.Role(entry.role)], "content": entry.content}
    return item


class SessionmemSession:
    """One sessionmem conversation as an Agents SDK session (``session_id`` is the conversation id).

    ``window``: the ``SessionSettings.limit`` the Runner reads history with (default 40, sessionmem's replay
    window; None replays the whole stored conversation). ``session_settings`` overrides it entirely.
    ``include_summary``: put the rolling summary, when there is one, before a windowed history.
    """

    def __init__(
        self,
        conversation_id: str,
        client: AsyncMemoryClient | None = None,
        *,
        window: int | None = env.DEFAULT_REPLAY_MESSAGES,
        session_settings: SessionSettings | None = None,
        include_summary: bool = False,
    ) -> None:
        self.session_id = validate_conversation_id(conversation_id)
        self.session_settings: SessionSettings | None = (
            session_settings if session_settings is not None else SessionSettings(limit=window)
        )
        self._owned: AsyncMemoryClient | None = None
        if client is None:
            client = self._owned = AsyncMemoryClient()
        self.client = client
        self.include_summary = include_summary

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The latest ``limit`` items, oldest first; all stored items when ``limit`` is None."""
        if limit is not None and limit <= 0:
            return []
        if limit is not None and limit <= env.MAX_READ_LIMIT:
            window = await self.client._read_window(self.session_id, limit, self.include_summary)
            # A checked role of the wire is an item role already ("user", "assistant", "system").
            return [{"role": e["role"], "content": e["content"]} for e in window]
        entries = (await self.client.export(self.session_id)).entries
        if limit is not None:
            entries = entries[-limit:]
        return [entry_to_item(e) for e in entries]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store the message items of ``items`` (one atomic append per 64 entries); the rest is skipped.
        An item the server refuses (too long) raises its InvalidRequest, and nothing of its batch is stored."""
        entries: list[EntryFields] = [
            {"role": stored[0].value, "content": stored[1]}
            for stored in (_stored_as(item) for item in items)
            if stored is not None
        ]
        size = env.MAX_ENTRIES_PER_APPEND
        for start in range(0, len(entries), size):
            await self.client._append_batch(self.session_id, entries[start : start + size])

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item (None when the conversation is empty), conditionally on the
        version read: a concurrent write makes it re-read and pop the then-newest item."""
        for _ in range(_POP_ATTEMPTS):
            history = await self.client.export(self.session_id)
            if not history.entries:
                return None
            *rest, last = history.entries
            try:
                if rest:
                    await self.client.replace(self.session_id, rest, if_version=history.version)
                else:
                    await self.client.delete(self.session_id)
            except VersionConflict:
                continue
            return entry_to_item(last)
        raise VersionConflict(f"pop_item: conversation kept changing ({_POP_ATTEMPTS} attempts)")

    async def clear_session(self) -> None:
        await self.client.delete(self.session_id)

    async def aclose(self) -> None:
        """Close the client this session made itself (a client passed in is the caller's to close)."""
        if self._owned is not None:
            await self._owned.aclose()

    def __repr__(self) -> str:
        return f"SessionmemSession(session_id={self.session_id!r})"
