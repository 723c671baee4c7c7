"""A sequential Python agent's memory cost per turn: read the last 40 entries, then append the turn (a tool
turn: the user message, the model's tool call, the tool's output and the answer; all four are kept).

Each variant runs the same turns, one at a time, in this process, on conversations seeded with 40 entries
through the variant's own API; a conversation is retired after 20 turns (so every history holds 40-78
entries) and the next one is seeded outside the timed part. What is timed is exactly a turn's two memory
calls, as the agent framework makes them:

- sessionmem through the launcher (full path: client -> launcher -> proxy -> Valkey), with the project's
  client (``sessionmem_client``: its OpenAI Agents ``Session`` and its LangChain chat history), and with a
  minimal keep-alive HTTP client sending the ``Session``'s entries, made once (the cost of the path itself,
  without a client library);
- openai-agents ``RedisSession`` (in-process, redis-py asyncio, against the same Valkey), ``get_items(40)``
  and ``add_items``; with its default settings, and with ``ttl`` set like sessionmem's 24 h retention;
- langchain-community ``RedisChatMessageHistory`` (one instance per conversation, reused, default settings):
  ``messages`` (it has no windowed read: it reads the whole list) and ``add_messages``.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import Any

import orjson

from bench.data import ASSISTANT_TEXT, READ_LIMIT, USER_TEXT
from sessionmem_core import api

TURNS_PER_CONVERSATION = 20
SEED_ENTRIES = 40


@dataclass
class AgentResult:
    name: str
    description: str
    turns: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    error: str | None = None
    samples: list[float] = field(default_factory=list, repr=False)

    def as_json(self) -> dict[str, Any]:
        """Every field but the raw samples (kept only to merge rounds)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "samples"}


def _summary(name: str, description: str, samples: list[float]) -> AgentResult:
    ordered = sorted(samples)
    return AgentResult(
        name=name,
        description=description,
        turns=len(ordered),
        mean_ms=statistics.fmean(ordered) * 1000,
        p50_ms=statistics.median(ordered) * 1000,
        p90_ms=ordered[int(len(ordered) * 0.9)] * 1000,
        samples=ordered,
    )


def merged(rounds: list[AgentResult]) -> AgentResult:
    """One variant's rounds as one result, over all their turns; the first failure, if any round failed."""
    failed = next((r for r in rounds if r.error), None)
    if failed is not None:
        return failed
    return _summary(rounds[0].name, rounds[0].description, [s for r in rounds for s in r.samples])


def _failed(name: str, description: str, exc: BaseException) -> AgentResult:
    return AgentResult(name, description, 0, 0.0, 0.0, 0.0, error=f"{type(exc).__name__}: {exc}")


# --- the driver: conversations of 20 turns, seeded untimed, each turn timed ---

Turn = Callable[[], None]
AsyncTurn = Callable[[], Awaitable[None]]


def _settle_garbage_collector() -> None:
    """A full collection before a variant's turns: the first variant to import a framework (openai-agents,
    langchain: ~10^5 objects) otherwise pays, inside its timed turns, the full collections those imports
    owe (~30 ms each, seen as a tail on whichever variant ran first). Garbage a variant makes per turn is
    still collected during its own turns."""
    gc.collect()


def _run_sync(new_conversation: Callable[[int], Turn], warmup: float, seconds: float) -> list[float]:
    _settle_garbage_collector()
    samples: list[float] = []
    start = time.perf_counter()
    index = 0
    while time.perf_counter() - start < warmup + seconds:
        turn = new_conversation(index)
        index += 1
        for _ in range(TURNS_PER_CONVERSATION):
            began = time.perf_counter()
            turn()
            took = time.perf_counter() - began
            if began - start >= warmup:
                samples.append(took)
    return samples


async def _run_async(
    new_conversation: Callable[[int], Awaitable[AsyncTurn]], warmup: float, seconds: float
) -> list[float]:
    _settle_garbage_collector()
    samples: list[float] = []
    start = time.perf_counter()
    index = 0
    while time.perf_counter() - start < warmup + seconds:
        turn = await new_conversation(index)
        index += 1
        for _ in range(TURNS_PER_CONVERSATION):
            began = time.perf_counter()
            await turn()
            took = time.perf_counter() - began
            if began - start >= warmup:
                samples.append(took)
    return samples


def _seed_items() -> list[dict[str, str]]:
    return [
        {"role": "user", "content": USER_TEXT} if i % 2 == 0 else {"role": "assistant", "content": ASSISTANT_TEXT}
        for i in range(SEED_ENTRIES)
    ]


def _tool_turn_items() -> list[dict[str, Any]]:
    """One tool turn as the Agents SDK hands it to its session."""
    return [
        {"role": "user", "content": USER_TEXT},
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"order": "66"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "ships tomorrow"},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": ASSISTANT_TEXT, "annotations": []}],
        },
    ]


def _as_entries(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as the memory API's entries, each with its role and text and the item itself, as the Agents SDK
    session sends them (for the minimal client, which has no adapter)."""
    texts = {"function_call": "arguments", "function_call_output": "output"}
    entries = []
    for item in items:
        role = item.get("role") or item["type"]
        content = item.get(texts.get(role, "content"), "")
        if not isinstance(content, str):
            content = "\n".join(part["text"] for part in content)
        entries.append({"role": role, "content": content, "item": item})
    return entries


def _tool_turn_messages() -> list[Any]:
    """One tool turn as LangChain hands it to its history."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    return [
        HumanMessage(USER_TEXT),
        AIMessage("", tool_calls=[{"name": "lookup", "args": {"order": "66"}, "id": "call_1"}]),
        ToolMessage("ships tomorrow", tool_call_id="call_1"),
        AIMessage(ASSISTANT_TEXT),
    ]


# --- sessionmem, minimal client: one keep-alive socket, the two HTTP requests of a turn ---


class KeepAliveHTTP:
    """A blocking HTTP/1.1 keep-alive client for one local server (Content-Length answers only)."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._host = f"127.0.0.1:{port}"

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        head = f"{method} {path} HTTP/1.1\r\nhost: {self._host}\r\n"
        if body or method in ("POST", "PUT"):
            head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        self._sock.sendall(head.encode() + b"\r\n" + body)
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            buffer += self._recv()
        header, _, rest = buffer.partition(b"\r\n\r\n")
        length = 0
        for line in header.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            rest += self._recv()
        return int(header[9:12]), rest[:length]

    def _recv(self) -> bytes:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        return chunk

    def close(self) -> None:
        self._sock.close()


def sessionmem_raw(port: int, warmup: float, seconds: float) -> AgentResult:
    name = "sessionmem, minimal HTTP client"
    description = "full path; a keep-alive socket + orjson (the path's own cost, no client library)"
    http = KeepAliveHTTP(port)
    # The Agents SDK session's requests, made once: the same entries and bytes, without the library.
    body = orjson.dumps({"entries": _as_entries(_tool_turn_items())})
    seed = orjson.dumps({"entries": _as_entries(_seed_items())})

    def new_conversation(index: int) -> Turn:
        path = api.entries_path(f"agent-raw-{index}")
        status, _ = http.request("POST", path, seed)
        assert status == 200, status

        def turn() -> None:
            status, payload = http.request("GET", f"{path}?limit={READ_LIMIT}")
            assert status == 200, status
            history = orjson.loads(payload)["entries"]
            assert len(history) == READ_LIMIT
            status, _ = http.request("POST", path, body)
            assert status == 200, status

        return turn

    try:
        return _summary(name, description, _run_sync(new_conversation, warmup, seconds))
    finally:
        http.close()


# --- sessionmem, the project's client and its framework adapters ---


def sessionmem_agents_session(port: int, warmup: float, seconds: float) -> AgentResult:
    name = "sessionmem, Agents SDK Session"
    description = "full path; sessionmem_client.openai_agents.SessionmemSession (AsyncMemoryClient)"
    try:
        client_mod: Any = importlib.import_module("sessionmem_client")
        session_mod: Any = importlib.import_module("sessionmem_client.openai_agents")
    except ImportError as exc:
        return _failed(name, description, exc)

    async def main() -> list[float]:
        client = client_mod.AsyncMemoryClient(f"http://127.0.0.1:{port}")
        items = _tool_turn_items()

        async def new_conversation(index: int) -> AsyncTurn:
            session = session_mod.SessionmemSession(f"agent-sdk-{index}", client)
            await session.add_items(_seed_items())

            async def turn() -> None:
                history = await session.get_items(limit=READ_LIMIT)
                assert len(history) == READ_LIMIT
                await session.add_items(items)

            return turn

        try:
            return await _run_async(new_conversation, warmup, seconds)
        finally:
            await client.aclose()

    try:
        return _summary(name, description, asyncio.run(main()))
    except Exception as exc:
        return _failed(name, description, exc)


def sessionmem_langchain(port: int, warmup: float, seconds: float) -> AgentResult:
    name = "sessionmem, LangChain history"
    description = "full path; sessionmem_client.langchain.SessionmemChatMessageHistory (MemoryClient)"
    try:
        client_mod: Any = importlib.import_module("sessionmem_client")
        history_mod: Any = importlib.import_module("sessionmem_client.langchain")
        from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    except ImportError as exc:
        return _failed(name, description, exc)
    client = client_mod.MemoryClient(f"http://127.0.0.1:{port}")
    seed: list[BaseMessage] = [
        HumanMessage(USER_TEXT) if i % 2 == 0 else AIMessage(ASSISTANT_TEXT) for i in range(SEED_ENTRIES)
    ]

    def new_conversation(index: int) -> Turn:
        history = history_mod.SessionmemChatMessageHistory(f"agent-lc-{index}", client)
        history.add_messages(seed)

        def turn() -> None:
            messages = history.messages[-READ_LIMIT:]  # every message (as RedisChatMessageHistory reads)
            assert len(messages) == READ_LIMIT
            history.add_messages(_tool_turn_messages())

        return turn

    try:
        return _summary(name, description, _run_sync(new_conversation, warmup, seconds))
    except Exception as exc:
        return _failed(name, description, exc)
    finally:
        client.close()


# --- the in-process alternatives, on the same Valkey ---


def openai_agents_redis_session(valkey_port: int, warmup: float, seconds: float, ttl: int | None) -> AgentResult:
    name = "openai-agents RedisSession" + (" (ttl 24 h)" if ttl else "")
    description = "in-process; agents.extensions.memory.redis_session.RedisSession, redis-py asyncio" + (
        f", ttl={ttl}" if ttl else ", default settings (no ttl)"
    )
    try:
        import redis.asyncio as redis_async
        from agents.extensions.memory.redis_session import RedisSession
    except ImportError as exc:
        return _failed(name, description, exc)

    async def main() -> list[float]:
        client = redis_async.Redis(host="127.0.0.1", port=valkey_port)
        items: list[Any] = _tool_turn_items()
        tag = "ttl" if ttl else "plain"

        async def new_conversation(index: int) -> AsyncTurn:
            session = RedisSession(f"bench-{tag}-{index}", redis_client=client, key_prefix="bench:agents", ttl=ttl)
            await session.clear_session()
            await session.add_items(list(_seed_items()))  # type: ignore[arg-type]

            async def turn() -> None:
                history = await session.get_items(limit=READ_LIMIT)
                assert len(history) == READ_LIMIT
                await session.add_items(items)

            return turn

        try:
            return await _run_async(new_conversation, warmup, seconds)
        finally:
            await client.aclose()

    try:
        return _summary(name, description, asyncio.run(main()))
    except Exception as exc:
        return _failed(name, description, exc)


def langchain_redis_history(valkey_port: int, warmup: float, seconds: float) -> AgentResult:
    name = "langchain-community RedisChatMessageHistory"
    description = (
        "in-process; one instance per conversation, reused, default settings (no ttl); .messages reads the whole list"
    )
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module: Any = importlib.import_module("langchain_community.chat_message_histories.redis")
        from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    except ImportError as exc:
        return _failed(name, description, exc)
    seed: list[BaseMessage] = [
        HumanMessage(USER_TEXT) if i % 2 == 0 else AIMessage(ASSISTANT_TEXT) for i in range(SEED_ENTRIES)
    ]
    url = f"redis://127.0.0.1:{valkey_port}/0"

    def new_conversation(index: int) -> Turn:
        history = module.RedisChatMessageHistory(f"bench-{index}", url=url, key_prefix="bench:lc:")
        history.clear()
        history.add_messages(seed)

        def turn() -> None:
            messages = history.messages[-READ_LIMIT:]
            assert len(messages) == READ_LIMIT
            history.add_messages(_tool_turn_messages())

        return turn

    try:
        return _summary(name, description, _run_sync(new_conversation, warmup, seconds))
    except Exception as exc:
        return _failed(name, description, exc)
