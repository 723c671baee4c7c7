"""The OpenAI Agents SDK adapter against the real stack: the SDK's own ``Runner`` drives the session, with
the SDK's ``agents.testing.ScriptedModel`` in place of a model (offline), and the history lands in Valkey."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.items import TResponseInputItem
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call

from sessionmem_client import (
    AsyncMemoryClient,
    InvalidConversationId,
    InvalidRequest,
    PayloadTooLarge,
    new_conversation_id,
)
from sessionmem_client.openai_agents import SessionmemSession, entry_to_item, item_to_entry
from sessionmem_core import env
from sessionmem_core.keys import Owner, session_key
from sessionmem_launcher.server import Launcher
from tests.support.items import SHAPES
from tests.support.valkey import ValkeyProcess

OWNER = Owner(namespace="team-a", agent="support-agent")
OFFLINE = RunConfig(tracing_disabled=True)
# The Agents SDK's item shapes (LangChain's serialized messages are the LangChain adapter's).
SDK_SHAPES = [shape for shape in SHAPES.values() if "data" not in shape[2]]


def expected_role(item: Mapping[str, Any]) -> str:
    """The entry role of an item: its role, else its type, else "message"."""
    return str(item.get("role") or item.get("type") or "message")


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


async def test_a_tool_turn_replays_the_tool_call_and_its_output(
    launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    """The next turn's model input holds what RedisSession would replay: the user message, the function
    call, its output and the answer, as the SDK produced them."""
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
        assert [role for role, _ in stored(valkey_server, cid)] == [
            "user",
            "function_call",
            "function_call_output",
            "assistant",
        ]
        await Runner.run(agent, "Thanks", session=session, run_config=OFFLINE)
        replayed = model.last_call
        assert replayed is not None and isinstance(replayed.input, list)
        kinds = [item.get("type", "message") for item in replayed.input if isinstance(item, Mapping)]
        assert kinds == ["message", "function_call", "function_call_output", "message", "message"]
        output = next(i for i in replayed.input if isinstance(i, Mapping) and i.get("type") == "function_call_output")
        assert output["call_id"] == "call_1" and output["output"] == "order 66 ships tomorrow"


async def test_every_item_shape_round_trips_as_given(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    cid = new_conversation_id()
    items = [item for _, _, item in SDK_SHAPES]
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        session = SessionmemSession(cid, memory)
        assert session.session_id == cid and session.session_settings == SessionSettings()
        assert await session.get_items() == [] and await session.pop_item() is None
        await session.add_items(items)  # type: ignore[arg-type]  # the SDK's item dicts, and LangChain's
        got = await session.get_items()
        assert got == items and [list(g) for g in got] == [list(i) for i in items], "equal, key order kept"
        assert [role for role, _ in stored(valkey_server, cid)] == [expected_role(item) for _, _, item in SDK_SHAPES]
        assert await session.get_items(2) == items[-2:]
        assert len(await session.get_items(env.MAX_READ_LIMIT + 1)) == len(items)
        assert await session.get_items(0) == []

        assert await session.pop_item() == items[-1]
        assert await session.get_items() == items[:-1]
        await session.add_items([])  # nothing to store, no call
        await session.clear_session()
        assert stored(valkey_server, cid) == [] and await session.get_items() == []


async def test_session_settings_limit_and_its_dict_form(launcher: Launcher) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        items: list[TResponseInputItem] = [{"role": "user", "content": f"m{n}"} for n in range(5)]
        await SessionmemSession(cid, memory).add_items(items)
        assert await SessionmemSession(cid, memory, session_settings=SessionSettings(limit=2)).get_items() == items[-2:]
        as_dict = SessionmemSession(cid, memory, session_settings={"limit": 3})
        assert await as_dict.get_items() == items[-3:] and await as_dict.get_items(1) == items[-1:]


async def test_an_item_too_large_to_store_is_a_typed_error_and_nothing_of_the_batch_is_stored(
    launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        session = SessionmemSession(cid, memory)
        too_large: TResponseInputItem = {"type": "function_call_output", "call_id": "c", "output": "x" * (1 << 20)}
        with pytest.raises((InvalidRequest, PayloadTooLarge)):
            await session.add_items([{"role": "user", "content": "fits"}, too_large])
        assert stored(valkey_server, cid) == []


async def test_concurrent_pops_remove_distinct_items(launcher: Launcher) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        items: list[TResponseInputItem] = [{"role": "user", "content": f"m{n}"} for n in range(8)]
        await SessionmemSession(cid, memory).add_items(items)
        popped = await asyncio.gather(*(SessionmemSession(cid, memory).pop_item() for _ in range(10)))
    assert sorted(str(p) for p in popped if p is not None) == sorted(str(i) for i in items)
    assert popped.count(None) == 2


def test_item_mapping() -> None:
    assert item_to_entry({"role": "user", "content": "hi"}) == {
        "role": "user",
        "content": "hi",
        "item": {"role": "user", "content": "hi"},
    }
    for _, content, item in SDK_SHAPES:
        entry = item_to_entry(item)
        assert entry["item"] is item and entry["role"] == expected_role(item), item
        if "type" in item or "role" in item:  # an SDK item: its text is found (arbitrary JSON has none)
            assert content in entry["content"], item
    mapped = item_to_entry(assistant_message("from a model object"))
    assert mapped["role"] == "assistant" and mapped["content"] == "from a model object"
    assert entry_to_item({"role": "user", "content": "old entry", "id": "x"}) == {
        "role": "user",
        "content": "old entry",
    }


def test_a_bad_conversation_id_fails_before_the_network() -> None:
    with pytest.raises(ValueError) as raised:
        SessionmemSession("a:b", AsyncMemoryClient("http://127.0.0.1:9"))
    assert isinstance(raised.value, InvalidConversationId)
