"""The LangChain adapter against the real stack: a multi-turn conversation through
``RunnableWithMessageHistory`` with langchain-core's fake chat model ends up in Valkey (read directly)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

from sessionmem_client import (
    AsyncMemoryClient,
    InvalidConversationId,
    InvalidRequest,
    MemoryClient,
    new_conversation_id,
)
from sessionmem_client.langchain import SessionmemChatMessageHistory, message_to_entry
from sessionmem_core import env, wire
from sessionmem_core.keys import Owner, session_key
from sessionmem_launcher.server import Launcher
from tests.support.valkey import ValkeyProcess

# RunnableWithMessageHistory is deprecated since langchain-core 1.3.3 (in favour of LangGraph persistence)
# but is still what most LangChain users have.
pytestmark = pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")

OWNER = Owner(namespace="team-a", agent="support-agent")


def memory_url(launcher: Launcher) -> str:
    return f"http://127.0.0.1:{launcher.memory_port}"


def stored(valkey: ValkeyProcess, conversation_id: str) -> list[dict[str, Any]]:
    return [orjson.loads(raw) for raw in valkey.client().lrange(session_key(OWNER, conversation_id), 0, -1)]


def roles_and_texts(messages: list[BaseMessage]) -> list[tuple[str, str]]:
    return [(m.type, str(m.text)) for m in messages]


class Recorder:
    """Sits between the prompt and the model and keeps every prompt the model was given."""

    def __init__(self) -> None:
        self.prompts: list[list[BaseMessage]] = []

    def __call__(self, value: PromptValue) -> PromptValue:
        self.prompts.append(value.to_messages())
        return value


def support_chain(recorder: Recorder, answers: list[str]) -> Any:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a terse support agent."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    return prompt | RunnableLambda(recorder) | FakeListChatModel(responses=answers)


ANSWERS = ["Hello Ada!", "Your name is Ada.", "Green tea it is."]
QUESTIONS = ["Hi, I'm Ada", "What is my name?", "I'd like green tea"]


async def test_a_multi_turn_conversation_is_kept_in_sessionmem_sync(
    launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    cid = new_conversation_id()
    recorder = Recorder()

    def conversation() -> list[str]:
        with MemoryClient(memory_url(launcher)) as memory:
            chain = RunnableWithMessageHistory(
                support_chain(recorder, ANSWERS),
                lambda session_id: SessionmemChatMessageHistory(session_id, memory),
                input_messages_key="question",
                history_messages_key="history",
            )
            config: Any = {"configurable": {"session_id": cid}}
            return [str(chain.invoke({"question": q}, config=config).content) for q in QUESTIONS]

    assert await asyncio.to_thread(conversation) == ANSWERS
    # Each turn's prompt carried the turns before it, read back from sessionmem.
    assert roles_and_texts(recorder.prompts[2]) == [
        ("system", "You are a terse support agent."),
        ("human", "Hi, I'm Ada"),
        ("ai", "Hello Ada!"),
        ("human", "What is my name?"),
        ("ai", "Your name is Ada."),
        ("human", "I'd like green tea"),
    ]
    raw = stored(valkey_server, cid)
    assert [(e["role"], e["content"]) for e in raw] == [
        ("user", "Hi, I'm Ada"),
        ("assistant", "Hello Ada!"),
        ("user", "What is my name?"),
        ("assistant", "Your name is Ada."),
        ("user", "I'd like green tea"),
        ("assistant", "Green tea it is."),
    ], "only the exchange is stored: not the system prompt"
    assert [e["v"] for e in raw] == [1, 1, 2, 2, 3, 3], "one atomic append per turn"
    assert {e["author"] for e in raw} == {"team-a/support-agent"}


async def test_a_multi_turn_conversation_is_kept_in_sessionmem_async(
    launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    cid = new_conversation_id()
    recorder = Recorder()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        chain = RunnableWithMessageHistory(
            support_chain(recorder, ANSWERS),
            lambda session_id: SessionmemChatMessageHistory(session_id, async_client=memory),
            input_messages_key="question",
            history_messages_key="history",
        )
        config: Any = {"configurable": {"session_id": cid}}
        for question, answer in zip(QUESTIONS[:2], ANSWERS[:2], strict=True):
            assert (await chain.ainvoke({"question": question}, config=config)).content == answer
    assert roles_and_texts(recorder.prompts[1])[1:3] == [("human", "Hi, I'm Ada"), ("ai", "Hello Ada!")]
    raw = stored(valkey_server, cid)
    assert [(e["role"], e["content"], e["v"]) for e in raw] == [
        ("user", "Hi, I'm Ada", 1),
        ("assistant", "Hello Ada!", 1),
        ("user", "What is my name?", 2),
        ("assistant", "Your name is Ada.", 2),
    ]

    # A cold pod: a new client and history object read the stored context back.
    def cold_read() -> list[BaseMessage]:
        with MemoryClient(memory_url(launcher)) as fresh:
            return SessionmemChatMessageHistory(cid, fresh).messages

    messages = await asyncio.to_thread(cold_read)
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, HumanMessage, AIMessage]
    assert [m.id for m in messages] == [e["id"] for e in raw], "messages carry their entry ids"


async def test_tool_traffic_is_skipped_and_the_exchange_is_one_append(
    launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        history = SessionmemChatMessageHistory(cid, async_client=memory)
        await history.aadd_messages(
            [
                SystemMessage("Answer about orders."),
                HumanMessage("Where is order 66?"),
                AIMessage("", tool_calls=[{"name": "order_status", "args": {"id": "66"}, "id": "call_1"}]),
                ToolMessage("ships tomorrow", tool_call_id="call_1"),
                AIMessage([{"type": "text", "text": "Order 66 "}, {"type": "text", "text": "ships tomorrow."}]),
                ChatMessage(role="tool", content="not a chat role we store"),
            ]
        )
        assert [(m.type, str(m.text)) for m in await history.aget_messages()] == [
            ("system", "Answer about orders."),
            ("human", "Where is order 66?"),
            ("ai", "Order 66 ships tomorrow."),
        ]
        await history.aadd_messages([ToolMessage("only scratch", tool_call_id="call_2")])  # nothing to store
        raw = stored(valkey_server, cid)
        assert [e["role"] for e in raw] == ["system", "user", "assistant"] and {e["v"] for e in raw} == {1}
        await history.aclear()
    assert stored(valkey_server, cid) == []


async def test_retried_messages_are_stored_once_and_sync_methods_work(
    launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    cid = new_conversation_id()

    def scenario() -> None:
        with MemoryClient(memory_url(launcher)) as memory:
            history = SessionmemChatMessageHistory(cid, memory, window=2)
            batch: list[BaseMessage] = [HumanMessage("q1", id="m1"), AIMessage("a1", id="m2")]
            history.add_messages(batch)
            history.add_messages(batch)  # a retry: the ids are already stored
            history.add_user_message("q2")
            history.add_ai_message("a2")
            assert len(stored(valkey_server, cid)) == 4
            assert roles_and_texts(history.messages) == [("human", "q2"), ("ai", "a2")], "window of 2"
            history.messages = [SystemMessage("seeded")]  # assigning replaces the stored history
            assert [(e["role"], e["content"]) for e in stored(valkey_server, cid)] == [("system", "seeded")]
            history.clear()
            assert history.messages == []

    await asyncio.to_thread(scenario)
    assert valkey_server.client().exists(session_key(OWNER, cid)) == 0


async def test_async_methods_fall_back_to_the_sync_client(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    cid = new_conversation_id()
    memory = MemoryClient(memory_url(launcher))
    try:
        history = SessionmemChatMessageHistory(cid, memory)
        await history.aadd_messages([HumanMessage("hi"), AIMessage("hello")])
        assert roles_and_texts(await history.aget_messages()) == [("human", "hi"), ("ai", "hello")]
        await history.aclear()
        assert stored(valkey_server, cid) == []
    finally:
        await asyncio.to_thread(memory.close)


async def test_a_message_too_long_to_store_is_a_typed_error_and_nothing_of_the_batch_is_stored(
    launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        history = SessionmemChatMessageHistory(cid, async_client=memory)
        with pytest.raises(InvalidRequest, match="content"):
            await history.aadd_messages([HumanMessage("fits"), AIMessage("x" * (env.MAX_CONTENT_CHARS + 1))])
        assert stored(valkey_server, cid) == []


def test_an_async_only_history_refuses_sync_calls_and_bad_ids_fail_early() -> None:
    history = SessionmemChatMessageHistory("c", async_client=AsyncMemoryClient("http://127.0.0.1:9"))
    assert isinstance(history, BaseChatMessageHistory)
    with pytest.raises(RuntimeError, match="async"):
        _ = history.messages
    with pytest.raises(InvalidConversationId):
        SessionmemChatMessageHistory("a/b", MemoryClient("http://127.0.0.1:9"))


def test_message_mapping() -> None:
    def entry(message: BaseMessage) -> tuple[str, str, str | None] | None:
        mapped = message_to_entry(message)
        return None if mapped is None else (mapped.role, mapped.content, mapped.id)

    assert entry(HumanMessage("hi", id="m-1")) == ("user", "hi", "m-1")
    assert entry(HumanMessage("hi", id="run:1")) == ("user", "hi", None), "an id the rule rejects is not kept"
    assert entry(AIMessage("answer")) == ("assistant", "answer", None)
    assert entry(SystemMessage("rules")) == ("system", "rules", None)
    assert entry(ChatMessage(role="assistant", content="x")) == ("assistant", "x", None)
    assert entry(ChatMessage(role="Human", content="x")) == ("user", "x", None)
    assert entry(AIMessage("calling", tool_calls=[{"name": "t", "args": {}, "id": "c1"}])) is None
    assert entry(ToolMessage("result", tool_call_id="c1")) is None
    assert entry(HumanMessage([{"type": "image_url", "image_url": {"url": "data:,"}}])) is None, "no text"
    assert message_to_entry(AIMessage("x")) == wire.EntryIn(role=wire.Role.ASSISTANT, content="x")
