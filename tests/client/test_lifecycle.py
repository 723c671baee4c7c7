"""The client's lifecycle calls (info, export, listing, clearing, erasing a user) against the real stack:
in-process launcher -> real proxy process -> real valkey-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from starlette.types import Receive, Scope, Send

from sessionmem_client import (
    AsyncMemoryClient,
    ConversationInfo,
    History,
    InvalidRequest,
    MemoryClient,
    NotFound,
    TurnNotLive,
    new_conversation_id,
)
from sessionmem_core import api, env
from sessionmem_core.capability import mint_capability, new_key
from sessionmem_core.keys import Owner, session_key, session_prefix
from sessionmem_demo.agent import read_body
from sessionmem_launcher.server import Launcher
from tests.client.test_docs import EXAMPLES, NOT_RUN
from tests.conftest import launcher_settings
from tests.support.processes import ServiceProcess, dev_proxy
from tests.support.serving import serve_in_background
from tests.support.valkey import ValkeyProcess

OWNER = Owner(namespace="team-a", agent="support-agent")


def memory_url(launcher: Launcher) -> str:
    return f"http://127.0.0.1:{launcher.memory_port}"


def agent_keys(valkey: ValkeyProcess) -> list[str]:
    return sorted(k.decode() for k in valkey.client().keys(session_prefix(OWNER) + "*"))


async def test_info_says_whether_a_conversation_exists(launcher: Launcher) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        absent = await memory.info(cid)
        assert isinstance(absent, ConversationInfo)
        assert (absent.conversation_id, absent.exists, absent.version, absent.entries) == (cid, False, 0, 0)
        assert absent.ttl_seconds is None
        await memory.append_exchange(cid, "u", "a")
        await memory.append_exchange(cid, "u2", "a2")
        present = await memory.info(cid)
    assert (present.exists, present.version, present.entries, present.scope) == (True, 2, 4, "session")
    assert present.ttl_seconds is not None and 0 < present.ttl_seconds <= env.DEFAULT_TTL_SECONDS


async def test_export_returns_every_entry_not_just_the_window(launcher: Launcher) -> None:
    cid = new_conversation_id()
    total = env.DEFAULT_REPLAY_MESSAGES + 30

    def scenario() -> History:
        with MemoryClient(memory_url(launcher)) as memory:
            for turn in range(total // 2):
                memory.append_exchange(cid, f"question {turn}", f"answer {turn}", turn_id=f"t{turn}")
            assert len(memory.read(cid).entries) == env.DEFAULT_REPLAY_MESSAGES
            return memory.export(cid)

    exported = await asyncio.to_thread(scenario)
    assert isinstance(exported, History) and exported.conversation_id == cid
    assert len(exported.entries) == total and exported.version == total // 2
    assert exported.entries[0].content == "question 0" and exported.entries[-1].content == f"answer {total // 2 - 1}"


async def test_an_export_over_many_proxy_pages_is_whole_and_in_order(launcher: Launcher) -> None:
    """The proxy answers about 1 MiB an export page; the launcher joins the pages into one History."""
    cid = new_conversation_id()
    big = "x" * 200_000
    async with httpx.AsyncClient(base_url=memory_url(launcher), timeout=30) as raw:
        for batch in range(6):
            entries = [{"role": "user", "content": f"{batch * 4 + i}:{big}"} for i in range(4)]
            assert (await raw.post(api.entries_path(cid), json={"entries": entries})).status_code == 200
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        exported = await memory.export(cid)
    assert [entry.content.split(":", 1)[0] for entry in exported.entries] == [str(i) for i in range(24)]
    assert exported.version == 6 and exported.next_offset is None


async def test_listing_pages_through_every_conversation(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    cids = sorted(new_conversation_id() for _ in range(7))
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        for cid in cids:
            await memory.append_exchange(cid, "u", "a")
        listed = [cid async for cid in memory.iter_conversations(page_size=3)]
        first = await memory.list_conversations(limit=50)
    assert sorted(listed) == cids and len(listed) == len(set(listed))
    assert sorted(ref.conversation_id for ref in first.conversations) == cids and first.next_cursor is None

    def sync_listing() -> list[str]:
        with MemoryClient(memory_url(launcher)) as memory:
            return list(memory.iter_conversations(page_size=2))

    assert sorted(await asyncio.to_thread(sync_listing)) == cids


async def test_metadata_sets_the_catalogues_title_and_labels(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        await memory.append_exchange("ticket-9", "u", "a")
        record = await memory.set_metadata("ticket-9", title="Order 66", labels={"team": "billing"})
        assert (record.conversation_id, record.title, record.labels) == ("ticket-9", "Order 66", {"team": "billing"})
        (listed,) = (await memory.list_conversations()).conversations
        assert (listed.title, listed.labels) == ("Order 66", {"team": "billing"})
        with pytest.raises(NotFound):  # a conversation nobody wrote is not listed
            await memory.set_metadata("ticket-10", labels={"team": "billing"})
        with pytest.raises(InvalidRequest):  # checked before any network call
            await memory.set_metadata("ticket-9", labels={"no spaces": "x"})

    def sync_title() -> str | None:
        with MemoryClient(memory_url(launcher)) as memory:
            return memory.set_metadata("ticket-9", title="Order 67").title

    assert await asyncio.to_thread(sync_title) == "Order 67"


async def test_an_agent_cannot_erase_all_of_its_memory(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    """Bulk erasure is an administrator's act: through the launcher an agent gets a typed 403 and keeps
    every conversation."""
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        await memory.append_exchange("kept", "u", "a")
    async with httpx.AsyncClient(base_url=memory_url(launcher)) as raw:
        refused = await raw.delete("/v1/conversations", params={"confirm": "true"})
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "forbidden"
    assert valkey_server.client().exists(session_key(OWNER, "kept")) == 1


# --- per-user memory: a proxy that verifies run capabilities, and a perUser launcher ---


@pytest.fixture
def capability_key(tmp_path: Path) -> bytes:
    return new_key()


@pytest.fixture
def per_user_proxy(valkey_server: ValkeyProcess, tmp_path: Path, capability_key: bytes) -> Iterator[ServiceProcess]:
    key_file = tmp_path / "capability-key"
    key_file.write_bytes(capability_key + b"\n")
    proc = dev_proxy(
        valkey_server.url,
        **{
            env.CAPABILITY_KEY_FILE: str(key_file),
        },
    )
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
async def per_user_launcher(per_user_proxy: ServiceProcess, dev_token_file: Path) -> AsyncIterator[Launcher]:
    settings = launcher_settings(per_user_proxy.base_url, dev_token_file, **{env.PER_USER: "true"})
    instance = Launcher(settings, tracer_provider=TracerProvider(), serve_host="127.0.0.1", serve=serve_in_background)
    await instance.start()
    yield instance
    await instance.stop()


async def test_erase_user_removes_only_that_users_conversations(
    per_user_launcher: Launcher, valkey_server: ValkeyProcess, capability_key: bytes
) -> None:
    # The handles of two turns in flight, as the managed loop binds them for the requests it relays.
    turns = per_user_launcher.turns
    alice_cap = mint_capability(capability_key, "alice", OWNER, 600)
    bob_cap = mint_capability(capability_key, "bob", OWNER, 600)
    with turns.bound(alice_cap) as alice_turn, turns.bound(bob_cap) as bob_turn:
        async with AsyncMemoryClient(memory_url(per_user_launcher), turn=alice_turn) as alice:
            bob = alice.with_turn(bob_turn)
            await alice.append_exchange("c1", "I am Alice", "Hi Alice")
            await alice.append_exchange("c2", "Alice again", "Hello")
            await bob.append_exchange("c1", "I am Bob", "Hi Bob")
            assert [e.content for e in (await bob.read("c1")).entries] == ["I am Bob", "Hi Bob"], "per-user buckets"
            assert sorted([c async for c in alice.iter_conversations()]) == ["c1", "c2"]
            assert len(agent_keys(valkey_server)) == 3

            erased = await alice.erase_user()
            assert (sorted(erased.conversations), erased.entries) == (["c1", "c2"], 4)
            assert (await alice.read("c1")).entries == []
            assert [e.content for e in (await bob.read("c1")).entries] == ["I am Bob", "Hi Bob"]
    assert len(agent_keys(valkey_server)) == 1

    def sync_erase(turn: str) -> list[str]:
        with MemoryClient(memory_url(per_user_launcher), turn=turn) as memory:
            return memory.erase_user().conversations

    with turns.bound(bob_cap) as bob_turn:
        assert await asyncio.to_thread(sync_erase, bob_turn) == ["c1"]
    assert agent_keys(valkey_server) == []
    with pytest.raises(TurnNotLive):  # that turn is over: its handle erases nothing any more
        await asyncio.to_thread(sync_erase, bob_turn)


@dataclass
class DocsExampleAgent:
    """An agent whose request handler is the per-user example of docs/client.md: it reads the request's
    headers and JSON body (``conversation``, ``input``, or ``forget``) and answers ``output``."""

    handle_request: Callable[[Mapping[str, str], str, str], str]
    forget_me: Callable[[Mapping[str, str]], list[str]]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        request = orjson.loads(body)
        if request.get("forget"):
            output: object = await asyncio.to_thread(self.forget_me, headers)
        else:
            output = await asyncio.to_thread(self.handle_request, headers, request["conversation"], request["input"])
        answer = orjson.dumps({"output": output})
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": answer})


async def test_the_per_user_example_of_the_docs_runs_as_an_agent(
    per_user_proxy: ServiceProcess,
    dev_token_file: Path,
    valkey_server: ValkeyProcess,
    capability_key: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (code,) = [code for section, code in EXAMPLES if code.startswith(NOT_RUN) and "per-user" in section.lower()]
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(code, "docs/client.md", "exec"), namespace)  # noqa: S102 - our own documentation
    agent = await serve_in_background(DocsExampleAgent(namespace["handle_request"], namespace["forget_me"]))
    settings = launcher_settings(
        per_user_proxy.base_url, dev_token_file, **{env.PER_USER: "true", env.AGENT_PORT: str(agent.port)}
    )
    launcher = Launcher(settings, tracer_provider=TracerProvider(), serve_host="127.0.0.1", serve=serve_in_background)
    await launcher.start()
    monkeypatch.setenv(env.LAUNCHER_PORT, str(launcher.memory_port))  # the client's default URL, as in a pod
    alice = {api.USER_CAPABILITY_HEADER: mint_capability(capability_key, "alice", OWNER, 600)}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.serve_port}") as client:

            async def request(body: dict[str, Any]) -> object:
                response = await client.post("/", json=body, headers=alice)  # single-shot: the agent's own memory
                assert response.status_code == 200, response.text
                return response.json()["output"]

            assert await request({"conversation": "c1", "input": "hello"}) == "I can see 0 earlier messages."
            assert await request({"conversation": "c1", "input": "again"}) == "I can see 2 earlier messages."
            assert len(agent_keys(valkey_server)) == 1
            assert await request({"forget": True}) == ["c1"]
    finally:
        await launcher.stop()
        await agent.stop()
    assert agent_keys(valkey_server) == []


async def test_one_users_kept_reads_are_never_anothers(per_user_launcher: Launcher, capability_key: bytes) -> None:
    """One client serving two users' turns (``with_turn``) keeps a read per turn: each user's reads of the
    same conversation id are their own, asked again with their own ETag (a 304 each), never the other's."""
    from langchain_core.messages import HumanMessage

    from sessionmem_client.langchain import SessionmemChatMessageHistory

    seen: list[int] = []

    async def hook(response: httpx.Response) -> None:
        if response.request.method == "GET":
            seen.append(response.status_code)

    turns = per_user_launcher.turns
    alice_cap = mint_capability(capability_key, "alice", OWNER, 600)
    bob_cap = mint_capability(capability_key, "bob", OWNER, 600)
    with turns.bound(alice_cap) as alice_turn, turns.bound(bob_cap) as bob_turn:
        async with (
            httpx.AsyncClient(base_url=memory_url(per_user_launcher), event_hooks={"response": [hook]}) as http,
            AsyncMemoryClient(memory_url(per_user_launcher), http_client=http, turn=alice_turn) as alice,
        ):
            users = {"Alice": alice, "Bob": alice.with_turn(bob_turn)}
            for who, client in users.items():
                await SessionmemChatMessageHistory("c", async_client=client).aadd_messages(
                    [HumanMessage(f"I am {who}")]
                )
            for _ in range(2):
                for who, client in users.items():
                    read = await SessionmemChatMessageHistory("c", async_client=client).aget_messages()
                    assert read == [HumanMessage(f"I am {who}")]
    assert seen == [200, 200, 304, 304]
