"""The clients' conditional reads on the real stack (in-process launcher -> real proxy -> real valkey-server):
an adapter's unchanged read is a 304 answered from what the client kept, its own append moves that on, and
any other write (another writer's append, an erasure and a new conversation at the same version) makes
the next read a full one. The statuses are recorded by httpx's event hooks on a real connection."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from sessionmem_client import AsyncMemoryClient, MemoryClient
from sessionmem_client.langchain import SessionmemChatMessageHistory
from sessionmem_client.openai_agents import SessionmemSession
from sessionmem_launcher.server import Launcher

TOOL_TURN: list[Any] = [
    {"role": "user", "content": "where is order 66?"},
    {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"order": "66"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "ships tomorrow"},
    {"role": "assistant", "content": "It ships tomorrow."},
]


def _url(launcher: Launcher) -> str:
    return f"http://127.0.0.1:{launcher.memory_port}"


class Statuses:
    """The status of every read (GET) a client sent, in order."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def hook(self, response: httpx.Response) -> None:
        if response.request.method == "GET":
            self.seen.append(response.status_code)

    def sync_hook(self, response: httpx.Response) -> None:
        if response.request.method == "GET":
            self.seen.append(response.status_code)

    def take(self) -> list[int]:
        seen, self.seen = self.seen, []
        return seen


@pytest.fixture
def statuses() -> Iterator[Statuses]:
    yield Statuses()


def _history(conversation_id: str, client: AsyncMemoryClient) -> SessionmemChatMessageHistory:
    return SessionmemChatMessageHistory(conversation_id, async_client=client)


TURN: list[BaseMessage] = [
    HumanMessage("where is order 66?"),
    AIMessage("", tool_calls=[{"name": "lookup", "args": {"order": "66"}, "id": "c1"}]),
    ToolMessage("ships tomorrow", tool_call_id="c1"),
    AIMessage("It ships tomorrow."),
]
NEXT = [HumanMessage("next")]


async def test_an_unchanged_read_is_a_304_and_the_clients_own_appends_keep_it_so(
    launcher: Launcher, statuses: Statuses
) -> None:
    async with (
        httpx.AsyncClient(base_url=_url(launcher), event_hooks={"response": [statuses.hook]}) as http,
        AsyncMemoryClient(_url(launcher), http_client=http) as client,
    ):
        history = _history("cond-async", client)
        await history.aadd_messages(TURN[:1])
        first = await history.aget_messages()
        again = await history.aget_messages()
        assert again == first == TURN[:1]
        await history.aadd_messages(TURN[1:])
        after = await history.aget_messages()
        assert after == TURN
        assert statuses.take() == [200, 304, 304], "the client's own append moved its kept read on"
        # A new list each time: the caller's to change.
        after.append(HumanMessage("extra"))
        assert await history.aget_messages() == TURN
        assert statuses.take() == [304]


async def test_another_writer_and_a_conversation_made_again_are_full_reads(
    launcher: Launcher, statuses: Statuses
) -> None:
    async with (
        httpx.AsyncClient(base_url=_url(launcher), event_hooks={"response": [statuses.hook]}) as http,
        AsyncMemoryClient(_url(launcher), http_client=http) as client,
        AsyncMemoryClient(_url(launcher)) as other_client,
    ):
        mine, theirs = _history("cond-two", client), _history("cond-two", other_client)
        await mine.aadd_messages(TURN[:2])
        assert await mine.aget_messages() == TURN[:2]
        await theirs.aadd_messages(TURN[2:3])
        assert await mine.aget_messages() == TURN[:3]
        # Another writer came between the last read and this append: the kept read is not moved on.
        await theirs.aadd_messages(TURN[3:])
        await mine.aadd_messages(NEXT)
        assert await mine.aget_messages() == [*TURN, *NEXT]
        assert statuses.take() == [200, 200, 200]
        assert await mine.aget_messages() == [*TURN, *NEXT]
        assert statuses.take() == [304]
        # Erased and written again by the other writer up to the same version, other messages.
        version = (await other_client.info("cond-two")).version
        await theirs.aclear()
        renewed = [HumanMessage(f"new {n}") for n in range(version)]
        for message in renewed:
            await theirs.aadd_messages([message])
        assert (await other_client.info("cond-two")).version == version
        assert await mine.aget_messages() == renewed
        assert statuses.take() == [200]


async def test_a_session_reads_its_items_afresh(launcher: Launcher, statuses: Statuses) -> None:
    """The Agents SDK session's reads are not kept (docs/client.md): plain reads, fresh items."""
    async with (
        httpx.AsyncClient(base_url=_url(launcher), event_hooks={"response": [statuses.hook]}) as http,
        AsyncMemoryClient(_url(launcher), http_client=http) as client,
    ):
        session = SessionmemSession("cond-sdk", client)
        await session.add_items(TOOL_TURN)
        first: list[Any] = await session.get_items(limit=40)
        first[0]["content"] = "changed"
        assert await session.get_items(limit=40) == TOOL_TURN
        assert statuses.take() == [200, 200]


async def test_a_langchain_history_is_conditional_sync(launcher: Launcher, statuses: Statuses) -> None:
    # The sync client in a thread: the launcher serves on this test's event loop.
    await asyncio.to_thread(_langchain_history_is_conditional, launcher, statuses)


def _langchain_history_is_conditional(launcher: Launcher, statuses: Statuses) -> None:
    with (
        httpx.Client(base_url=_url(launcher), event_hooks={"response": [statuses.sync_hook]}) as http,
        MemoryClient(_url(launcher), http_client=http) as client,
        MemoryClient(_url(launcher)) as other_client,
    ):
        history = SessionmemChatMessageHistory("cond-lc", client)
        turn: list[BaseMessage] = [
            HumanMessage("where is order 66?"),
            AIMessage("", tool_calls=[{"name": "lookup", "args": {"order": "66"}, "id": "c1"}]),
            ToolMessage("ships tomorrow", tool_call_id="c1"),
            AIMessage("It ships tomorrow."),
        ]
        history.add_messages(turn[:1])
        assert history.messages == turn[:1]
        history.add_messages(turn[1:])
        assert history.messages == turn
        assert history.messages == turn
        SessionmemChatMessageHistory("cond-lc", other_client).add_messages([HumanMessage("from elsewhere")])
        assert history.messages == [*turn, HumanMessage("from elsewhere")]
        assert statuses.take() == [200, 304, 304, 200]
        # Off (read_cache_bytes=0): every read is a full one.
        with MemoryClient(_url(launcher), http_client=http, read_cache_bytes=0) as uncached:
            plain = SessionmemChatMessageHistory("cond-lc", uncached)
            assert plain.messages == plain.messages
        assert statuses.take() == [200, 200]
