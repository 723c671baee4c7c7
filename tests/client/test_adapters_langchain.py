"""The LangChain adapter against the real stack: a multi-turn conversation through
``RunnableWithMessageHistory`` with langchain-core's fake chat model ends up in Valkey (read directly)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

from sessionmem_client import (
    AsyncMemoryClient,
    InvalidConversationId,
    InvalidRequest,
    MemoryClient,
    PayloadTooLarge,
    new_conversation_id,
)
from sessionmem_client.langchain import SessionmemChatMessageHistory, entry_to_message, message_to_entry
from sessionmem_core import env
from sessionmem_core.keys import Owner, session_key
from sessionmem_launcher.server import Launcher
from tests.conftest import launcher_settings
from tests.support.processes import dev_proxy
from tests.support.serving import serve_in_background
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
    assert messages == messages_from_dict([e["item"] for e in raw]), "the messages as they were added"


TOOL_TURN: list[BaseMessage] = [
    SystemMessage("Answer about orders."),
    HumanMessage("Where is order 66?", id="h-1", additional_kwargs={"channel": "web"}),
    AIMessage(
        "",
        id="run-1",
        tool_calls=[{"name": "order_status", "args": {"id": "66"}, "id": "call_1"}],
        response_metadata={"model_name": "fake", "finish_reason": "tool_calls"},
        usage_metadata={"input_tokens": 12, "output_tokens": 3, "total_tokens": 15},
    ),
    ToolMessage("ships tomorrow", tool_call_id="call_1", name="order_status", artifact={"eta": "tomorrow"}),
    AIMessage([{"type": "text", "text": "Order 66 "}, {"type": "text", "text": "ships tomorrow."}], name="support"),
    ChatMessage(role="critic", content="fine"),
    HumanMessage(""),
]


async def test_every_message_type_is_kept_as_given_in_one_append(
    launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        history = SessionmemChatMessageHistory(cid, async_client=memory)
        await history.aadd_messages(TOOL_TURN)
        assert await history.aget_messages() == TOOL_TURN, "tool calls, tool results, metadata, empty text"
        raw = stored(valkey_server, cid)
        assert [e["role"] for e in raw] == ["system", "user", "assistant", "tool", "assistant", "critic", "user"]
        assert [e["content"] for e in raw][3:5] == ["ships tomorrow", "Order 66 ships tomorrow."]
        assert {e["v"] for e in raw} == {1}, "one atomic append"
        await history.aclear()
    assert stored(valkey_server, cid) == []


async def test_messages_are_all_of_them_and_sync_methods_work(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    cid = new_conversation_id()
    total = env.DEFAULT_REPLAY_MESSAGES + 20

    def scenario() -> None:
        with MemoryClient(memory_url(launcher)) as memory:
            history = SessionmemChatMessageHistory(cid, memory)
            batch: list[BaseMessage] = [HumanMessage("q1", id="m1"), AIMessage("a1", id="m1")]
            history.add_messages(batch)
            history.add_messages(batch)  # another call: stored again, ids kept as given (they may repeat)
            assert history.messages == batch + batch
            for n in range(total - 4):
                history.add_user_message(f"q{n}")
            assert len(history.messages) == total, "every message, not a replay window"
            assert len(SessionmemChatMessageHistory(cid, memory, window=2).messages) == 2
            history.messages = [SystemMessage("seeded")]  # assigning replaces the stored history
            assert history.messages == [SystemMessage("seeded")]
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


async def test_search_len_and_delete_as_langchain_redis_names_them(launcher: Launcher) -> None:
    """Beyond langchain-redis's own tests (tests/client/frameworks), which run the sync methods: the async
    search and its fallback, ``len`` under a window, and a match's item giving the message back."""
    cid = new_conversation_id()
    turn: list[BaseMessage] = [HumanMessage("Where is my Order?"), ToolMessage("order 66 ships", tool_call_id="c1")]
    sync = MemoryClient(memory_url(launcher))
    try:
        async with AsyncMemoryClient(memory_url(launcher)) as memory:
            history = SessionmemChatMessageHistory(cid, async_client=memory)
            assert (history.session_id, history.id, bool(history)) == (cid, cid, True)
            await history.aadd_messages(turn)
            found = await history.asearch_messages("ORDER ships", limit=1000)
            assert [entry_to_message(match) for match in found] == [turn[1], turn[0]], "more words first"
            assert [m["content"] for m in await history.asearch_messages("order", limit=1)] == ["order 66 ships"]
            assert await history.asearch_messages("") == [] and await history.asearch_messages("order", 0) == []
            fallback = SessionmemChatMessageHistory(cid, sync, window=1)
            assert await fallback.asearch_messages("where") == found[1:]
            assert await asyncio.to_thread(len, fallback) == 1, "what messages returns under the window"
            await asyncio.to_thread(fallback.delete)
            assert await history.aget_messages() == [] and await asyncio.to_thread(len, fallback) == 0
    finally:
        await asyncio.to_thread(sync.close)


async def test_a_message_too_large_to_store_is_a_typed_error_and_nothing_of_the_batch_is_stored(
    launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        history = SessionmemChatMessageHistory(cid, async_client=memory)
        with pytest.raises((InvalidRequest, PayloadTooLarge)):
            await history.aadd_messages([HumanMessage("fits"), AIMessage("x" * (1 << 20))])
        assert stored(valkey_server, cid) == []


def test_an_async_only_history_refuses_sync_calls_and_bad_ids_fail_early() -> None:
    history = SessionmemChatMessageHistory("c", async_client=AsyncMemoryClient("http://127.0.0.1:9"))
    assert isinstance(history, BaseChatMessageHistory)
    with pytest.raises(RuntimeError, match="async"):
        _ = history.messages
    with pytest.raises(InvalidConversationId):
        SessionmemChatMessageHistory("a/b", MemoryClient("http://127.0.0.1:9"))


def test_message_mapping() -> None:
    assert message_to_entry(HumanMessage("hi", id="m-1")) == {
        "role": "user",
        "content": "hi",
        "item": message_to_dict(HumanMessage("hi", id="m-1")),
    }
    roles = [message_to_entry(m)["role"] for m in TOOL_TURN]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "critic", "user"]
    assert [
        entry_to_message({"role": m["role"], "content": "x", "item": m["item"]})
        for m in map(message_to_entry, TOOL_TURN)
    ] == TOOL_TURN
    old = entry_to_message({"role": "assistant", "content": "from the managed loop", "id": "e1"})
    assert old == AIMessage("from the managed loop", id="e1"), "an entry without an item reads as its role and text"


@pytest.fixture
async def rate_limited_launcher(
    valkey_server: ValkeyProcess, dev_token_file: Path, demo_agent: int
) -> AsyncIterator[Launcher]:
    """The stack with a tight request rate (20/s, burst 10): sequential writers meet 429s."""
    proxy = dev_proxy(valkey_server.url, **{env.QUOTA_REQUESTS_PER_SECOND: "20", env.QUOTA_BURST: "10"})
    proxy.start()
    settings = launcher_settings(proxy.base_url, dev_token_file, **{env.AGENT_PORT: str(demo_agent)})
    instance = Launcher(settings, serve_host="127.0.0.1", serve=serve_in_background)
    await instance.start()
    yield instance
    await instance.stop()
    proxy.stop()


async def test_sequential_add_message_calls_past_the_rate_all_succeed(
    rate_limited_launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    """Each call past the burst is answered 429 at first; the client retries it (bounded) and none fails."""
    cid = new_conversation_id()
    calls = 40

    def scenario() -> int:
        with MemoryClient(memory_url(rate_limited_launcher)) as memory:
            history = SessionmemChatMessageHistory(cid, memory)
            for n in range(calls):
                history.add_message(HumanMessage(f"m{n}"))
            return len(history.messages)

    assert await asyncio.to_thread(scenario) == calls
    assert len(stored(valkey_server, cid)) == calls, "each stored once"
