"""The OpenAI Agents SDK adapter against the real stack: the SDK's own ``Runner`` drives the session, with
the SDK's ``agents.testing.ScriptedModel`` in place of a model (offline), and the history lands in Valkey."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson
import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.items import TResponseInputItem
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call

from sessionmem_client import AsyncMemoryClient, EntryLike, InvalidConversationId, InvalidRequest, new_conversation_id
from sessionmem_client.openai_agents import SessionmemSession, item_to_entry
from sessionmem_core import env, wire
from sessionmem_core.keys import Owner, session_key
from sessionmem_launcher.server import Launcher
from tests.support.valkey import ValkeyProcess

OWNER = Owner(namespace="team-a", agent="support-agent")
OFFLINE = RunConfig(tracing_disabled=True)


def memory_url(launcher: Launcher) -> str:
    return f"http://127.0.0.1:{launcher.memory_port}"


def stored(valkey: ValkeyProcess, conversation_id: str) -> list[tuple[str, str]]:
    raw = valkey.client().lrange(session_key(OWNER, conversation_id), 0, -1)
    return [(entry["role"], entry["content"]) for entry in map(orjson.loads, raw)]


def text_of(item: Any) -> str:
    content = item.get("content") if isinstance(item, Mapping) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def messages_seen(inputs: Iterable[Any]) -> list[tuple[str, str]]:
    return [(str(item.get("role")), text_of(item)) for item in inputs if isinstance(item, Mapping) and "role" in item]


@function_tool
def order_status(order_id: str) -> str:
    """Where an order is."""
    return f"order {order_id} ships tomorrow"


async def test_runner_conversation_is_kept_in_sessionmem(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    cid = new_conversation_id()
    model = ScriptedModel(
        [
            [assistant_message("Hello Ada!", item_id="msg_1")],
            [assistant_message("Your name is Ada.", item_id="msg_2")],
        ]
    )
    agent = Agent(name="support", instructions="Be brief.", model=model)
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        session = SessionmemSession(cid, memory)
        assert isinstance(session, Session), "satisfies the SDK's Session protocol"
        first = await Runner.run(agent, "Hi, I'm Ada", session=session, run_config=OFFLINE)
        assert first.final_output == "Hello Ada!"
        assert stored(valkey_server, cid) == [("user", "Hi, I'm Ada"), ("assistant", "Hello Ada!")]

    # A cold pod: another client and session object on the same conversation.
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        second = await Runner.run(agent, "What is my name?", session=SessionmemSession(cid, memory), run_config=OFFLINE)
    assert second.final_output == "Your name is Ada."
    assert model.last_call is not None and isinstance(model.last_call.input, list)
    assert messages_seen(model.last_call.input) == [
        ("user", "Hi, I'm Ada"),
        ("assistant", "Hello Ada!"),
        ("user", "What is my name?"),
    ], "the model was given the stored history"
    assert stored(valkey_server, cid) == [
        ("user", "Hi, I'm Ada"),
        ("assistant", "Hello Ada!"),
        ("user", "What is my name?"),
        ("assistant", "Your name is Ada."),
    ]
    model.assert_complete()


async def test_tool_calls_are_not_stored_only_the_exchange(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    cid = new_conversation_id()
    model = ScriptedModel(
        [
            [function_call("order_status", {"order_id": "66"}, call_id="call_1")],
            [assistant_message("Order 66 ships tomorrow.")],
            [assistant_message("You're welcome.")],
        ]
    )
    agent = Agent(name="support", instructions="Use tools.", model=model, tools=[order_status])
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        session = SessionmemSession(cid, memory)
        result = await Runner.run(agent, "Where is order 66?", session=session, run_config=OFFLINE)
        assert result.final_output == "Order 66 ships tomorrow."
        in_run = model.last_call
        assert in_run is not None and isinstance(in_run.input, list)
        assert any(isinstance(i, Mapping) and i.get("type") == "function_call_output" for i in in_run.input)
        assert stored(valkey_server, cid) == [("user", "Where is order 66?"), ("assistant", "Order 66 ships tomorrow.")]

        await Runner.run(agent, "Thanks", session=session, run_config=OFFLINE)
        replayed = model.last_call
        assert replayed is not None and isinstance(replayed.input, list)
        assert messages_seen(replayed.input) == [
            ("user", "Where is order 66?"),
            ("assistant", "Order 66 ships tomorrow."),
            ("user", "Thanks"),
        ], "the next turn replays the clean exchange, no dangling tool call"
        assert not any(isinstance(i, Mapping) and "call_id" in i for i in replayed.input)


async def test_session_protocol_methods(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        session = SessionmemSession(cid, memory, window=None)
        assert session.session_id == cid and session.session_settings == SessionSettings(limit=None)
        assert await session.get_items() == [] and await session.pop_item() is None
        items: list[TResponseInputItem] = [
            {"role": "developer", "content": "Be kind."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_9",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Hi there", "annotations": []}],
            },
            {"type": "function_call", "call_id": "c1", "name": "t", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            {"role": "user", "content": "Bye"},
        ]
        await session.add_items(items)
        assert stored(valkey_server, cid) == [
            ("system", "Be kind."),
            ("user", "Hello"),
            ("assistant", "Hi there"),
            ("user", "Bye"),
        ]
        assert await session.get_items(2) == [
            {"role": "assistant", "content": "Hi there"},
            {"role": "user", "content": "Bye"},
        ]
        assert len(await session.get_items()) == 4 == len(await session.get_items(env.MAX_READ_LIMIT + 1))
        assert await session.get_items(0) == []

        assert await session.pop_item() == {"role": "user", "content": "Bye"}
        assert stored(valkey_server, cid)[-1] == ("assistant", "Hi there") and len(stored(valkey_server, cid)) == 3
        await session.add_items([])  # nothing to store, no call
        await session.clear_session()
        assert stored(valkey_server, cid) == [] and await session.get_items() == []

        await session.add_items([{"role": "user", "content": "only one"}])
        assert await session.pop_item() == {"role": "user", "content": "only one"}
        assert stored(valkey_server, cid) == []


async def test_an_item_too_long_to_store_is_a_typed_error_and_nothing_of_the_batch_is_stored(
    launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        session = SessionmemSession(cid, memory)
        too_long: TResponseInputItem = {"role": "assistant", "content": "x" * (env.MAX_CONTENT_CHARS + 1)}
        with pytest.raises(InvalidRequest, match="content"):
            await session.add_items([{"role": "user", "content": "fits"}, too_long])
        assert stored(valkey_server, cid) == []
        await session.add_items([{"role": "user", "content": "x" * env.MAX_CONTENT_CHARS}])
        assert [len(content) for _, content in stored(valkey_server, cid)] == [env.MAX_CONTENT_CHARS]


class RacingClient(AsyncMemoryClient):
    """Lets another writer append between pop_item's read and its conditional replace, once."""

    def __init__(self, base_url: str, other: AsyncMemoryClient) -> None:
        super().__init__(base_url)
        self.other = other
        self.raced = False

    async def replace(
        self,
        conversation_id: str,
        entries: Iterable[EntryLike],
        if_version: int | None = None,
        *,
        traceparent: str | None = None,
    ) -> wire.ReplaceResponse:
        if not self.raced:
            self.raced = True
            await self.other.append(conversation_id, [{"role": "user", "content": "a concurrent message"}])
        return await super().replace(conversation_id, entries, if_version, traceparent=traceparent)


async def test_pop_item_is_conditional_and_never_loses_a_concurrent_write(
    launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as other:
        await other.append_exchange(cid, "question", "answer")
        racing = RacingClient(memory_url(launcher), other)
        try:
            popped = await SessionmemSession(cid, racing).pop_item()
        finally:
            await racing.aclose()
    assert racing.raced
    # The first replace hit 412 (the conversation moved on); the retry popped the then-newest item.
    assert popped == {"role": "user", "content": "a concurrent message"}
    assert stored(valkey_server, cid) == [("user", "question"), ("assistant", "answer")]


def test_item_mapping() -> None:
    def entry(item: Any) -> tuple[str, str] | None:
        mapped = item_to_entry(item)
        return None if mapped is None else (mapped.role, mapped.content)

    assert entry({"role": "user", "content": "hi"}) == ("user", "hi")
    assert entry({"role": "system", "content": "rules"}) == ("system", "rules")
    assert entry({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]}) == (
        "system",
        "d",
    )
    assert entry({"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}) == ("assistant", "No.")
    assert entry({"role": "assistant", "content": "thinking aloud", "phase": "commentary"}) is None
    assert entry({"role": "assistant", "content": "done", "phase": "final_answer"}) == ("assistant", "done")
    assert entry({"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}) is None
    assert entry({"type": "reasoning", "id": "rs_1", "summary": []}) is None
    assert entry({"type": "function_call_output", "call_id": "c", "output": "x"}) is None
    assert entry(assistant_message("from a model object")) == ("assistant", "from a model object")
    assert entry("not an item") is None


def test_a_bad_conversation_id_fails_before_the_network() -> None:
    with pytest.raises(InvalidConversationId):
        SessionmemSession("a:b", AsyncMemoryClient("http://127.0.0.1:9"))
