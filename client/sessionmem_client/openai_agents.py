"""OpenAI Agents SDK adapter: a ``Session`` (the SDK's ``agents.memory.Session`` protocol) kept in sessionmem.

    from agents import Agent, Runner
    from sessionmem_client import AsyncMemoryClient
    from sessionmem_client.openai_agents import SessionmemSession

    memory = AsyncMemoryClient()
    result = await Runner.run(agent, "Hi", session=SessionmemSession(conversation_id, memory))

What is stored: every item as given, one entry per item (the entry's ``item``): messages of every role,
function and hosted-tool calls and their outputs, reasoning (with its ``encrypted_content``), handoffs, MCP
items, ``EncryptedSession`` envelopes. ``get_items`` returns the items JSON-equal to what was added, so the
next turn's model input is what it would be with the SDK's own sessions, tool traffic included. The entry's
``role`` is the item's role, or its ``type`` for items without one (``function_call``); its ``content`` is
the item's text (message text parts, a tool output, reasoning summaries), which sessionmem's search, token
budgets and summaries use.

The session's reads are not kept by the client for conditional reads (docs/client.md, "Conditional
reads"): a window of items is made again from its answer for about what a kept one costs to hand out as
copies, and moving a kept one past each append costs more than the smaller answer saves (measured on the
benchmark's turn: +0.05 ms kept).

Conventions are the SDK's sessions': ``get_items()`` returns every item unless ``session_settings.limit``
(a ``SessionSettings`` or its dict form) or an explicit ``limit`` says otherwise. Each ``add_items`` call is
one atomic append per 64 items, sent with an ``Idempotency-Key`` of its own, so the client's retries store
it once whatever the item ids (items may repeat ids; the store keeps them as given). ``pop_item`` is the
memory API's atomic ``pop``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from sessionmem_client._requests import EntryFields, json_copy
from sessionmem_client.client import AsyncMemoryClient
from sessionmem_core import env
from sessionmem_core.errors import SessionMemError
from sessionmem_core.keys import new_message_id, validate_conversation_id

try:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.memory.session_settings import coerce_session_settings, resolve_session_limit
    from openai.types.responses import EasyInputMessageParam
except ImportError as exc:  # pragma: no cover - exercised only without openai-agents
    raise ImportError("sessionmem_client.openai_agents needs the OpenAI Agents SDK: pip install openai-agents") from exc

__all__ = ["SessionmemSession", "entry_to_item", "item_to_entry"]

_ROLE = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]{0,63}$")
_UNTYPED_ROLE = "message"  # an item with neither (an EncryptedSession envelope)
_TEXT_FIELDS = ("text", "refusal", "transcript")


def _as_dict(item: object) -> dict[str, Any]:
    """The item's JSON object: a dict as given, an SDK/openai pydantic model as its dict form."""
    if isinstance(item, dict):
        return item
    if isinstance(item, Mapping):
        return dict(item)
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        data = dump(exclude_unset=True, mode="json")
        if isinstance(data, dict):
            return data
    raise TypeError(f"a session item is a JSON object, not {type(item).__name__}")


def _text(value: object) -> str:
    """The text of a content or output field: a string, or the text of its parts."""
    if isinstance(value, str):
        return value
    if not isinstance(value, Sequence):
        return ""
    texts: list[str] = []
    for part in value:
        if isinstance(part, Mapping):
            for field in _TEXT_FIELDS:
                text = part.get(field)
                if isinstance(text, str):
                    texts.append(text)
                    break
    return "\n".join(texts)


def _item_text(data: Mapping[str, Any]) -> str:
    if "content" in data:
        return _text(data["content"])
    if "output" in data:
        return _text(data["output"])
    if "summary" in data:  # reasoning
        return _text(data["summary"])
    arguments = data.get("arguments")  # a tool call: its arguments are what a search would look for
    return arguments if isinstance(arguments, str) else ""


def _role(data: Mapping[str, Any]) -> str:
    for field in ("role", "type"):
        value = data.get(field)
        if isinstance(value, str) and _ROLE.match(value):
            return value
    return _UNTYPED_ROLE


def item_to_entry(item: object) -> EntryFields:
    """The entry an item is stored as: the item itself, its role (or type) and its text."""
    data = _as_dict(item)
    return {"role": _role(data), "content": _item_text(data)[: env.MAX_CONTENT_CHARS], "item": data}


def entry_to_item(entry: Mapping[str, Any]) -> TResponseInputItem:
    """The item an entry holds; an entry written without one (by an older client, or the managed loop)
    reads as an easy input message of its role and text."""
    item = entry.get("item")
    if isinstance(item, dict):
        return item  # type: ignore[return-value]  # stored as the SDK gave it
    message: EasyInputMessageParam = {"role": entry["role"], "content": entry["content"]}
    return message


def _items_of(entries: list[dict[str, Any]]) -> list[TResponseInputItem]:
    """What a read's entries hold: one item per entry (the client keeps them with the read, to answer an
    unchanged read without making them again)."""
    return [entry_to_item(entry) for entry in entries]


class SessionmemSession:
    """One sessionmem conversation as an Agents SDK session (``session_id`` is the conversation id).

    ``session_settings``: the SDK's ``SessionSettings`` (or its dict form); its ``limit`` is how many of the
    latest items ``get_items()`` returns (None, the default: all). An invalid conversation id raises
    :class:`~sessionmem_core.errors.InvalidConversationId`, a ``ValueError``.
    """

    session_settings: SessionSettings | None = None
    # Whether the client keeps this session's reads to ask again conditionally (see the module's doc).
    _KEEP_READS = False

    def __init__(
        self,
        session_id: str,
        client: AsyncMemoryClient | None = None,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        self.session_id = validate_conversation_id(session_id)
        self.session_settings = (
            coerce_session_settings(session_settings) if session_settings is not None else SessionSettings()
        )
        self._owned: AsyncMemoryClient | None = None
        if client is None:
            client = self._owned = AsyncMemoryClient()
        self.client = client

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The latest ``limit`` items (``session_settings.limit`` when None; all when both are None),
        oldest first, as they were added."""
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted is not None and wanted <= 0:
            return []
        window = wanted if wanted is not None and wanted <= env.MAX_READ_LIMIT else None
        items, kept = await self.client._read_converted(self.session_id, window, _items_of, self._KEEP_READS)
        if wanted is not None and window is None:
            items = items[-wanted:]
        # The caller's own copies: an agent may change the items it is given, never the client's kept read.
        return json_copy(items) if kept else items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store ``items`` as given: one atomic append per 64 items, each with its own idempotency key."""
        if not items:
            return
        entries = [item_to_entry(item) for item in items]
        key = new_message_id()
        size = env.MAX_ENTRIES_PER_APPEND
        for batch, start in enumerate(range(0, len(entries), size)):
            await self.client._append_batch(self.session_id, entries[start : start + size], f"{key}.{batch}")

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item (None when there is none), atomically."""
        popped = await self.client.pop(self.session_id)
        if popped.entry is None:
            return None
        return entry_to_item(popped.entry.model_dump(by_alias=True, exclude_none=True))

    async def clear_session(self) -> None:
        await self.client.delete(self.session_id)

    async def ping(self) -> bool:
        """Whether the memory endpoint answers for this conversation (a one-entry read), as the SDK's
        network sessions (Redis, MongoDB, Dapr) offer it. A probe: any failure is False, not raised."""
        try:
            await self.client._read_entries(self.session_id, 1)
        except SessionMemError:
            return False
        return True

    async def aclose(self) -> None:
        """Close the client this session made itself (a client passed in is the caller's to close)."""
        if self._owned is not None:
            await self._owned.aclose()

    async def close(self) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"SessionmemSession(session_id={self.session_id!r})"
