"""Issue #18, item 1: the end user's capability never reaches the agent process; the agent gets an opaque
handle that acts for that user only while its turn lasts.

A hostile echo agent (a compromised or prompt-injected agent process) records every header and body it is
sent, uses the handle it got during the turn, keeps every handle, and tries them again afterwards. Real
proxy process verifying capabilities, real valkey-server, the launcher in the test's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.types import Receive, Scope, Send

from sessionmem_client import AsyncMemoryClient, SessionMemError, TurnNotLive
from sessionmem_core import api, env
from sessionmem_core.capability import Keyring, mint_capability, user_bucket
from sessionmem_core.errors import Overloaded
from sessionmem_core.keys import Owner, per_user_key
from sessionmem_demo.agent import read_body
from sessionmem_launcher.managed_loop import AGENT_REQUEST_HEADERS
from sessionmem_launcher.server import Launcher
from sessionmem_launcher.turns import HANDLE_PREFIX, TurnBindings
from tests.conftest import launcher_settings
from tests.support.processes import ServiceProcess
from tests.support.serving import serve_in_background
from tests.support.valkey import ValkeyProcess, free_port

OWNER = Owner("team-a", "support-agent")
CAPABILITY_PREFIX = "smc2."


@dataclass
class HostileAgent:
    """Speaks the managed loop's protocol, and abuses whatever it is given. A request's JSON body may name
    a conversation to ``read`` and one to ``write`` through the turn handle during the turn; ``fail`` makes
    it answer 500; ``hold`` makes it wait for ``release`` and then try its handle once more, after the
    launcher has given up on it. ``leaked`` is a capability the agent somehow got, tried on the memory
    endpoint during every turn."""

    memory_url: str = ""
    leaked: str | None = None
    received: list[tuple[list[tuple[bytes, bytes]], bytes]] = field(default_factory=list)
    handles: list[str] = field(default_factory=list)
    leak_answers: list[httpx.Response] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    late_read: asyncio.Future[BaseException | None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        self.received.append((list(scope["headers"]), body))
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        request: dict[str, Any] = orjson.loads(body) if body else {}
        handle = headers.get(api.TURN_HEADER)
        answer: dict[str, Any] = {"output": f"echo {request.get('input')}"}
        if handle is not None:
            self.handles.append(handle)
            async with AsyncMemoryClient(self.memory_url, turn=handle) as memory:
                if "write" in request:
                    await memory.append_exchange(request["write"], "note", f"kept by {request['input']}")
                if "read" in request:
                    answer["seen"] = [e.content for e in (await memory.read(request["read"])).entries]
            if self.leaked is not None:
                await self._try_leaked(handle)
        if request.get("hold"):
            await self.release.wait()
            self.late_read = asyncio.get_running_loop().create_future()
            try:
                async with AsyncMemoryClient(self.memory_url, turn=handle) as memory:
                    await memory.read("c1")
                self.late_read.set_result(None)
            except SessionMemError as exc:
                self.late_read.set_result(exc)
        status = 500 if request.get("fail") else 200
        payload = orjson.dumps(answer)
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
        )
        await send({"type": "http.response.body", "body": payload})

    async def _try_leaked(self, handle: str) -> None:
        assert self.leaked is not None
        async with httpx.AsyncClient(base_url=self.memory_url) as raw:
            path = "/v1/conversations/c1/entries"
            self.leak_answers.append(await raw.get(path, headers={api.USER_CAPABILITY_HEADER: self.leaked}))
            both = {api.USER_CAPABILITY_HEADER: self.leaked, api.TURN_HEADER: handle}
            self.leak_answers.append(await raw.get(path, headers=both))


@pytest.fixture
async def hostile_agent() -> AsyncIterator[tuple[HostileAgent, int]]:
    agent = HostileAgent()
    server = await serve_in_background(agent)
    yield agent, server.port
    await server.stop()


async def _per_user_launcher(proxy: ServiceProcess, token_file: Path, agent_port: int, **extra: str) -> Launcher:
    settings = launcher_settings(
        proxy.base_url, token_file, **{env.PER_USER: "true", env.AGENT_PORT: str(agent_port), **extra}
    )
    launcher = Launcher(settings, serve_host="127.0.0.1", serve=serve_in_background)
    await launcher.start()
    return launcher


@pytest.fixture
async def launcher_of_hostile_agent(
    per_user_proxy: ServiceProcess, dev_token_file: Path, hostile_agent: tuple[HostileAgent, int]
) -> AsyncIterator[tuple[Launcher, HostileAgent]]:
    agent, port = hostile_agent
    launcher = await _per_user_launcher(per_user_proxy, dev_token_file, port)
    agent.memory_url = f"http://127.0.0.1:{launcher.memory_port}"
    yield launcher, agent
    await launcher.stop()


def _bucket_key(capability_key: bytes, user: str, conversation_id: str) -> str:
    """Where the proxy keeps ``user``'s conversation (its capability key also derives the buckets)."""
    return per_user_key(OWNER, user_bucket(Keyring.single(capability_key), OWNER, user), conversation_id)


async def test_no_capability_reaches_the_agent_and_a_handle_acts_for_its_user_only_during_its_turn(
    launcher_of_hostile_agent: tuple[Launcher, HostileAgent], capability_key: bytes, valkey_server: ValkeyProcess
) -> None:
    launcher, agent = launcher_of_hostile_agent
    alice = mint_capability(capability_key, "alice", OWNER, 600)
    bob = mint_capability(capability_key, "bob", OWNER, 600)

    async def send(capability: str, body: dict[str, Any], conversation: str | None = "c1") -> dict[str, Any]:
        headers = {
            api.USER_CAPABILITY_HEADER: capability,
            api.TURN_HEADER: f"{HANDLE_PREFIX}chosen-by-the-caller",  # a caller cannot pick the handle
            "authorization": f"Bearer {capability}",
            "cookie": f"session={capability}",
        }
        if conversation is not None:
            headers[api.CONVERSATION_ID_HEADER] = conversation
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.serve_port}") as client:
            response = await client.post("/invoke", json=body, headers=headers)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    first = await send(alice, {"input": "I am Alice", "read": "c1", "write": "notes"})
    second = await send(alice, {"input": "again", "read": "c1"})
    single_shot = await send(alice, {"input": "single", "read": "c1"}, conversation=None)
    bobs = await send(bob, {"input": "I am Bob", "read": "c1"})
    bobs_notes = await send(bob, {"input": "notes?", "read": "notes"}, conversation=None)

    # During its turn a handle reads and writes its own user's memory: nothing of anyone else's.
    assert first["seen"] == []
    assert second["seen"] == ["I am Alice", "echo I am Alice"]
    assert single_shot["seen"] == ["I am Alice", "echo I am Alice", "again", "echo again"]
    assert bobs["seen"] == [] and bobs_notes["seen"] == [], "Alice's handle wrote only into Alice's bucket"

    # (a) Nothing that reached the agent holds a capability: no header, no value, no body.
    assert len(agent.received) == 5
    for headers, body in agent.received:
        names = [name.decode("latin-1") for name, _ in headers]
        assert api.USER_CAPABILITY_HEADER not in names and "authorization" not in names and "cookie" not in names
        assert CAPABILITY_PREFIX.encode() not in body
        assert all(CAPABILITY_PREFIX.encode() not in value for _, value in headers)
        [handle] = [value.decode() for name, value in headers if name.decode("latin-1") == api.TURN_HEADER]
        assert handle.startswith(HANDLE_PREFIX) and handle != f"{HANDLE_PREFIX}chosen-by-the-caller"
    assert len(set(agent.handles)) == 5, "a fresh handle for every request"

    # (b) After their turns, the captured handles are worth nothing.
    assert len(launcher.turns) == 0
    async with httpx.AsyncClient(base_url=agent.memory_url) as raw:
        for handle in agent.handles:
            for method, path in (("GET", "/v1/conversations/c1/entries"), ("DELETE", "/v1/users/me/conversations")):
                late = await raw.request(method, path, headers={api.TURN_HEADER: handle})
                assert late.status_code == 401 and late.json()["error"]["type"] == "turn_not_live"
                assert "only during its turn" in late.json()["error"]["message"]
    async with AsyncMemoryClient(agent.memory_url, turn=agent.handles[0]) as late_client:
        with pytest.raises(TurnNotLive):
            await late_client.append_exchange("c1", "poison", "poison")

    # (c) Each user's memory is where the proxy keeps that user's, and nothing was erased or poisoned.
    keys = sorted(k.decode() for k in valkey_server.conversation_keys())
    assert keys == sorted(
        [
            _bucket_key(capability_key, "alice", "c1"),
            _bucket_key(capability_key, "alice", "notes"),
            _bucket_key(capability_key, "bob", "c1"),
        ]
    )
    store = valkey_server.client()
    assert store.llen(_bucket_key(capability_key, "alice", "c1")) == 4
    assert store.llen(_bucket_key(capability_key, "bob", "c1")) == 2


async def test_a_capability_that_leaked_to_the_agent_is_refused_by_the_memory_endpoint(
    launcher_of_hostile_agent: tuple[Launcher, HostileAgent], capability_key: bytes, valkey_server: ValkeyProcess
) -> None:
    launcher, agent = launcher_of_hostile_agent
    alice = mint_capability(capability_key, "alice", OWNER, 600)
    bob = mint_capability(capability_key, "bob", OWNER, 600)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.serve_port}") as client:
        stored = await client.post(
            "/",
            json={"input": "Alice's secret"},
            headers={api.USER_CAPABILITY_HEADER: alice, "x-conversation-id": "c1"},
        )
        agent.leaked = alice  # from here on, the agent holds Alice's capability: it serves Bob
        bobs = await client.post(
            "/", json={"input": "hi"}, headers={api.USER_CAPABILITY_HEADER: bob, "x-conversation-id": "c1"}
        )
    assert stored.status_code == 200 and bobs.status_code == 200
    # (d) Alone, or beside a live handle of another user's turn: a typed 401, nothing read.
    assert len(agent.leak_answers) == 2
    for refused in agent.leak_answers:
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"]["type"] == "capability_not_accepted"
        assert "Alice's secret" not in refused.text
    async with httpx.AsyncClient(base_url=agent.memory_url) as raw:
        after = await raw.delete("/v1/users/me/conversations", headers={api.USER_CAPABILITY_HEADER: alice})
    assert after.status_code == 401 and after.json()["error"]["type"] == "capability_not_accepted"
    assert valkey_server.client().llen(_bucket_key(capability_key, "alice", "c1")) == 2


async def test_the_binding_ends_when_the_agent_fails_or_is_given_up_on(
    per_user_proxy: ServiceProcess,
    dev_token_file: Path,
    hostile_agent: tuple[HostileAgent, int],
    capability_key: bytes,
) -> None:
    agent, port = hostile_agent
    launcher = await _per_user_launcher(per_user_proxy, dev_token_file, port, **{env.AGENT_TIMEOUT_SECONDS: "0.5"})
    agent.memory_url = f"http://127.0.0.1:{launcher.memory_port}"
    alice = {
        api.USER_CAPABILITY_HEADER: mint_capability(capability_key, "alice", OWNER, 600),
        "x-conversation-id": "c1",
    }
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.serve_port}") as client:
            failed = await client.post("/", json={"input": "x", "fail": True}, headers=alice)
            assert failed.status_code == 500 and failed.headers[api.MEMORY_STATUS_HEADER] == "not-stored"
            assert len(launcher.turns) == 0
            # The agent keeps working after the launcher stopped waiting: its handle died with the request.
            given_up = await client.post("/", json={"input": "x", "hold": True}, headers=alice)
            assert given_up.status_code == 502 and given_up.json()["error"]["type"] == "agent_unavailable"
            assert len(launcher.turns) == 0
            agent.release.set()
            deadline = asyncio.get_running_loop().time() + 10
            while agent.late_read is None:
                assert asyncio.get_running_loop().time() < deadline, "the held agent never woke up"
                await asyncio.sleep(0.01)
            late = await asyncio.wait_for(agent.late_read, timeout=10)
    finally:
        await launcher.stop()
    assert isinstance(late, TurnNotLive) and late.status == 401


async def test_a_per_user_agent_gets_a_handle_only_from_a_caller_with_a_capability(
    launcher_of_hostile_agent: tuple[Launcher, HostileAgent],
) -> None:
    launcher, agent = launcher_of_hostile_agent
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.serve_port}") as client:
        answer = await client.post("/", json={"input": "hi"}, headers={"x-conversation-id": "c1"})
    [(headers, _)] = agent.received
    assert api.TURN_HEADER.encode() not in [name for name, _ in headers]
    # Memory is refused (no user, no bucket), so the turn answers without context, as a backend outage would.
    assert answer.status_code == 200 and answer.headers[api.MEMORY_STATUS_HEADER] == "unavailable"
    async with httpx.AsyncClient(base_url=agent.memory_url) as raw:
        without = await raw.get("/v1/conversations/c1/entries")
        unknown = await raw.get("/v1/conversations/c1/entries", headers={api.TURN_HEADER: f"{HANDLE_PREFIX}guess"})
    assert without.status_code == 401 and without.json()["error"]["type"] == "user_capability_required"
    assert unknown.status_code == 401 and unknown.json()["error"]["type"] == "turn_not_live"


def test_neither_the_capability_nor_a_callers_turn_header_is_relayed_to_the_agent() -> None:
    assert api.USER_CAPABILITY_HEADER not in AGENT_REQUEST_HEADERS
    assert api.TURN_HEADER not in AGENT_REQUEST_HEADERS
    assert "authorization" not in AGENT_REQUEST_HEADERS and "cookie" not in AGENT_REQUEST_HEADERS


def test_a_binding_lives_exactly_as_long_as_its_block() -> None:
    turns = TurnBindings(max_live=2)
    with turns.bound("smc2.alice") as alice, turns.bound("smc2.bob") as bob:
        assert alice != bob and alice.startswith(HANDLE_PREFIX) and "alice" not in alice
        assert len(alice) > len(HANDLE_PREFIX) + 40, "256 random bits"
        assert (turns.resolve(alice), turns.resolve(bob)) == ("smc2.alice", "smc2.bob")
        with pytest.raises(Overloaded), turns.bound("smc2.carol"):
            pass
    with pytest.raises(RuntimeError), turns.bound("smc2.alice") as failing:
        raise RuntimeError("the agent call failed")
    assert len(turns) == 0
    for dead in (alice, bob, failing, "", "smc2.alice"):
        with pytest.raises(TurnNotLive):
            turns.resolve(dead)


def test_the_launcher_has_its_bindings_before_it_serves(dev_token_file: Path) -> None:
    settings = launcher_settings(f"http://127.0.0.1:{free_port()}", dev_token_file, **{env.MAX_CONNECTIONS: "3"})
    turns = Launcher(settings).turns
    with turns.bound("a"), turns.bound("b"), turns.bound("c"), pytest.raises(Overloaded), turns.bound("d"):
        pass
