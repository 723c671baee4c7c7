"""Memory policies on the real stack: token-budget replay, rolling summaries off the request path,
redaction before persistence, erasure and lifecycle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.types import Receive, Scope, Send

from sessionmem_core import env
from sessionmem_core.capability import mint_capability
from sessionmem_core.keys import Owner, session_key
from sessionmem_demo.agent import read_body
from sessionmem_launcher.replay import approx_tokens, message_cost
from sessionmem_launcher.server import Launcher
from tests.conftest import launcher_settings
from tests.support.processes import ServiceProcess
from tests.support.serving import serve_in_background
from tests.support.valkey import ValkeyProcess

OWNER = Owner("team-a", "support-agent")


async def _echo_agent(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers with the history it was given, so a test sees exactly what the launcher replayed."""
    body = await read_body(receive)
    request = orjson.loads(body) if body else {}
    answer = orjson.dumps({"output": f"answer to {request.get('input')}", "history": request.get("history", [])})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture
async def echo_agent_port() -> AsyncIterator[int]:
    server = await serve_in_background(_echo_agent)
    yield server.port
    await server.stop()


async def _launcher(proxy: ServiceProcess, token: Path, agent_port: int, **settings: str) -> Launcher:
    launcher = Launcher(
        launcher_settings(proxy.base_url, token, **{env.AGENT_PORT: str(agent_port), **settings}),
        serve_host="127.0.0.1",
        serve=serve_in_background,
    )
    await launcher.start()
    return launcher


async def test_token_budget_replay_never_exceeds_the_budget_or_splits_an_exchange(
    proxy_process: ServiceProcess, dev_token_file: Path, echo_agent_port: int
) -> None:
    budget = 60
    launcher = await _launcher(proxy_process, dev_token_file, echo_agent_port, **{env.REPLAY_TOKENS: str(budget)})
    headers = {"X-Conversation-Id": "budget"}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.serve_port}") as client:
            seen: list[list[dict[str, str]]] = []
            for turn in range(12):
                words = " ".join(["word"] * (turn % 4 * 5 + 1))
                response = await client.post("/", json={"input": f"turn {turn}: {words}"}, headers=headers)
                seen.append(response.json()["history"])
    finally:
        await launcher.stop()
    assert max(len(h) for h in seen) > 2, "some history was replayed"
    for history in seen:
        assert sum(message_cost(m, approx_tokens) for m in history) <= budget
        assert [m["role"] for m in history] == ["user", "assistant"] * (len(history) // 2), "whole exchanges"
    newest = seen[-1]
    assert newest[-2]["content"].startswith("turn 10:"), "the newest exchanges are the ones kept"


async def test_rolling_summary_is_made_off_the_request_path_and_replayed(
    proxy_process: ServiceProcess, dev_token_file: Path, echo_agent_port: int
) -> None:
    release = asyncio.Event()
    calls: list[dict[str, Any]] = []

    async def slow_summarizer(scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        calls.append(orjson.loads(body))
        await release.wait()
        said = [e["content"] for e in calls[-1]["entries"] if e["role"] == "user"]
        answer = orjson.dumps({"summary": " | ".join(filter(None, [calls[-1]["previousSummary"], *said]))})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    server = await serve_in_background(slow_summarizer)
    port = server.port
    launcher = await _launcher(
        proxy_process,
        dev_token_file,
        echo_agent_port,
        **{
            env.REPLAY_MESSAGES: "6",
            env.SUMMARY_THRESHOLD: "12",
            env.SUMMARIZER_URL: f"http://127.0.0.1:{port}/summarize",
        },
    )
    headers = {"X-Conversation-Id": "long"}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.serve_port}", timeout=10) as client:
            for turn in range(1, 8):
                text = "my name is Ada" if turn == 3 else f"small talk {turn}"
                response = await client.post("/", json={"input": text}, headers=headers)
                assert response.status_code == 200
            # Turn 7 took the conversation to 14 entries: it was answered, and only then does the
            # summariser get called, in the background; it is still blocked and nothing is summarised yet.
            for _ in range(1000):
                if calls:
                    break
                await asyncio.sleep(0.01)
            assert len(calls) == 1, "the summariser was called once, in the background"
            stored = (await client.post("/", json={"input": "still there?"}, headers=headers)).json()["history"]
            assert all(m["role"] != "system" for m in stored), "no summary exists while the summariser runs"
            release.set()
            await launcher._loop_app.compactor.idle()  # type: ignore[union-attr]
            for turn in range(8, 41):
                response = await client.post("/", json={"input": f"small talk {turn}"}, headers=headers)
                await launcher._loop_app.compactor.idle()  # type: ignore[union-attr]
            history = response.json()["history"]
    finally:
        release.set()
        await launcher.stop()
        await server.stop()
    assert history[0]["role"] == "system" and history[0]["content"].startswith("Relevant memory: ")
    assert "my name is Ada" in history[0]["content"], "a fact from turn 3 reaches turn 40"
    assert len(history) <= 7 and len(calls) >= 2


async def test_redacted_personal_data_never_reaches_valkey(
    proxy_process: ServiceProcess, dev_token_file: Path, demo_agent: int, valkey_server: ValkeyProcess
) -> None:
    launcher = await _launcher(proxy_process, dev_token_file, demo_agent, **{env.REDACT: "email,phone,card"})
    text = "mail ada@example.com or call +44 20 7946 0958, card 4111 1111 1111 1111, order 12345"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.serve_port}") as client:
            response = await client.post("/", json={"input": text}, headers={"X-Conversation-Id": "pii"})
    finally:
        await launcher.stop()
    assert response.status_code == 200
    raw = b"".join(valkey_server.client().lrange(session_key(OWNER, "pii"), 0, -1)).decode()
    assert "ada@example.com" not in raw and "7946" not in raw and "4111" not in raw
    assert "[redacted:email]" in raw and "[redacted:phone]" in raw and "[redacted:card]" in raw
    assert "order 12345" in raw, "what is not personal data is kept"


async def test_unknown_redactor_is_a_typed_400(proxy_process: ServiceProcess) -> None:
    from sessionmem_core.devauth import dev_token

    async with httpx.AsyncClient(base_url=proxy_process.base_url) as client:
        response = await client.post(
            "/v1/conversations/c/entries?redact=ssn",
            json={"entries": [{"role": "user", "content": "x"}]},
            headers={"Authorization": f"Bearer {dev_token('team-a', 'support-agent')}"},
        )
    assert response.status_code == 400 and "ssn" in response.json()["error"]["message"]


def test_erasing_a_user_leaves_other_users_intact_and_says_what_it_removed(
    per_user_proxy: ServiceProcess,
    capability_key: bytes,
    valkey_server: ValkeyProcess,
) -> None:
    from sessionmem_core.devauth import dev_token

    auth = {"Authorization": f"Bearer {dev_token('team-a', 'support-agent')}"}

    def as_user(subject: str) -> dict[str, str]:
        return {**auth, "X-Sessionmem-User-Capability": mint_capability(capability_key, subject, OWNER, 60)}

    body = {"entries": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]}
    with httpx.Client(base_url=per_user_proxy.base_url) as client:
        for conversation in ("c1", "c2"):
            client.post(f"/v1/conversations/{conversation}/entries", json=body, headers=as_user("alice"))
        client.post("/v1/conversations/c1/entries", json=body, headers=as_user("bob"))
        client.post("/v1/conversations/c1/entries", json=body, headers=auth)
        erased = client.delete("/v1/users/me/conversations", headers=as_user("alice")).json()
        again = client.delete("/v1/users/me/conversations", headers=as_user("alice")).json()
        bob = client.get("/v1/conversations/c1/entries", headers=as_user("bob")).json()
        plain = client.get("/v1/conversations/c1/entries", headers=auth).json()
        no_capability = client.delete("/v1/users/me/conversations", headers=auth)
    assert erased == {"conversations": ["c1", "c2"], "entries": 4}
    assert again == {"conversations": [], "entries": 0}
    assert len(bob["entries"]) == 2 and len(plain["entries"]) == 2
    assert no_capability.status_code == 400
    assert len(valkey_server.conversation_keys()) == 2


async def test_list_info_export_and_admin_erase(proxy_process: ServiceProcess, valkey_server: ValkeyProcess) -> None:
    from sessionmem_core.devauth import dev_token

    auth = {"Authorization": f"Bearer {dev_token('team-a', 'support-agent')}"}
    other = {"Authorization": f"Bearer {dev_token('team-a', 'other-agent')}"}
    body = {"entries": [{"role": "user", "content": "hello"}]}
    async with httpx.AsyncClient(base_url=proxy_process.base_url, headers=auth) as client:
        for i in range(120):
            await client.post(f"/v1/conversations/conv-{i:03d}/entries", json=body)
        await client.post("/v1/conversations/not-mine/entries", json=body, headers=other)
        listed: list[str] = []
        cursor: str | None = "0"
        pages = 0
        while cursor is not None:
            page = (await client.get("/v1/conversations", params={"limit": 50, "cursor": cursor})).json()
            listed += [c["conversationId"] for c in page["conversations"]]
            cursor, pages = page["nextCursor"], pages + 1
        info = (await client.get("/v1/conversations/conv-007")).json()
        missing = (await client.get("/v1/conversations/nope")).json()
        exported = (await client.get("/v1/conversations/conv-007/export")).json()
        refused = await client.delete("/v1/conversations")
        by_agent = await client.delete("/v1/conversations", params={"confirm": "true"})
        admin = {"Authorization": "Bearer dev-admin:alice"}
        path = "/v1/admin/namespaces/team-a/agents/support-agent/memory"
        as_agent = await client.delete(path)
        cleared = (await client.delete(path, headers=admin)).json()
    assert sorted(set(listed)) == [f"conv-{i:03d}" for i in range(120)] and pages >= 2
    assert info["exists"] and info["entries"] == 1 and info["version"] == 1 and 0 < info["ttlSeconds"] <= 86400
    assert missing == {"conversationId": "nope", "scope": "session", "exists": False, "version": 0, "entries": 0,
                       "ttlSeconds": None}  # fmt: skip
    assert [e["content"] for e in exported["entries"]] == ["hello"]
    assert refused.status_code == 400
    # Agents never erase in bulk, whatever they send: an administrator does, and gets a receipt.
    assert by_agent.status_code == 403 and "administrator" in by_agent.json()["error"]["message"]
    assert as_agent.status_code == 403
    assert cleared["entries"] == 120 and cleared["erasedBy"] == "alice"
    assert cleared["keys"] == [f"mem:team-a/support-agent:conv-{i:03d}" for i in range(120)]
    assert [k.decode() for k in valkey_server.conversation_keys()] == ["mem:team-a/other-agent:not-mine"]


async def test_shared_conversations_are_appended_and_read_by_members_and_erased_by_an_administrator(
    proxy_process: ServiceProcess, valkey_server: ValkeyProcess
) -> None:
    """Members of a registry append to and read a shared conversation, each entry stamped with its author;
    no member may replace or delete it for the others: an administrator erases the team's shared memory."""
    from sessionmem_core.devauth import dev_token

    def member(agent: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {dev_token('team-a', agent, 'support-team')}"}

    shared = {"scope": "shared"}
    entry = {"entries": [{"role": "system", "content": "always answer in French"}]}
    async with httpx.AsyncClient(base_url=proxy_process.base_url) as client:
        written = await client.post("/v1/conversations/plan/entries", params=shared, json=entry, headers=member("a"))
        read = (await client.get("/v1/conversations/plan/entries", params=shared, headers=member("b"))).json()
        replaced = await client.put("/v1/conversations/plan", params=shared, json=entry, headers=member("b"))
        deleted = await client.delete("/v1/conversations/plan", params=shared, headers=member("b"))
        by_agent = await client.delete("/v1/admin/registries/support-team/memory", headers=member("a"))
        erased = await client.delete(
            "/v1/admin/registries/support-team/memory", headers={"Authorization": "Bearer dev-admin:alice"}
        )
    assert written.status_code == 200
    assert [(e["role"], e["author"]) for e in read["entries"]] == [("system", "team-a/a")]
    for refused in (replaced, deleted, by_agent):
        assert refused.status_code == 403, refused.text
    assert "administrator" in replaced.json()["error"]["message"]
    receipt = erased.json()
    assert receipt["registry"] == "support-team" and receipt["keys"] == ["mem:shared:support-team:plan"]
    assert valkey_server.conversation_keys() == []


def test_replay_keeps_every_entrys_author() -> None:
    from sessionmem_launcher.replay import history_from

    body = {
        "entries": [
            {"role": "system", "content": "always answer in French", "author": "team-a/other-agent"},
            {"role": "user", "content": "hi", "author": "team-a/support-agent"},
        ]
    }
    _, window = history_from(body)
    assert [(m["role"], m["author"]) for m in window] == [
        ("system", "team-a/other-agent"),
        ("user", "team-a/support-agent"),
    ]


def test_replay_passes_the_agent_chat_text_only() -> None:
    """Entries a framework session wrote into the conversation (tool traffic, reasoning, developer
    messages, empty text) are not replayed to the managed loop's agent; its exchanges are, as text."""
    from sessionmem_launcher.replay import history_from
    from tests.support.items import SHAPES

    entries = [
        {"role": role, "content": content, "item": item, "author": "a/b"} for role, content, item in SHAPES.values()
    ]
    _, window = history_from({"entries": entries})
    assert window == [
        {"role": "user", "content": "hi", "author": "a/b"},
        {"role": "user", "content": "what is the weather", "author": "a/b"},
        {"role": "assistant", "content": "It is sunny.", "author": "a/b"},
        {"role": "user", "content": "what is this?", "author": "a/b"},
        {"role": "assistant", "content": "héllo ✓ 😀", "author": "a/b"},
    ]


async def test_an_administrator_erases_one_user_with_every_agent_of_a_namespace(
    per_user_proxy: ServiceProcess, capability_key: bytes, valkey_server: ValkeyProcess
) -> None:
    """The user's memory across agents: every agent's bucket of that user goes, in that namespace only;
    other users and other namespaces keep theirs, and the receipt names exactly what left Valkey."""
    from sessionmem_core.devauth import dev_token

    def as_user(namespace: str, agent: str, user: str) -> dict[str, str]:
        capability = mint_capability(capability_key, user, Owner(namespace, agent), 60)
        return {
            "Authorization": f"Bearer {dev_token(namespace, agent)}",
            "X-Sessionmem-User-Capability": capability,
        }

    body = {"entries": [{"role": "user", "content": "hello"}]}
    async with httpx.AsyncClient(base_url=per_user_proxy.base_url) as client:
        for namespace, agent, user in (
            ("team-a", "support", "alice"),
            ("team-a", "billing", "alice"),
            ("team-a", "support", "bob"),
            ("team-b", "support", "alice"),
        ):
            written = await client.post(
                "/v1/conversations/c1/entries", json=body, headers=as_user(namespace, agent, user)
            )
            assert written.status_code == 200
        before = set(valkey_server.conversation_keys())
        erased = await client.delete(
            "/v1/admin/namespaces/team-a/users/alice/memory", headers={"Authorization": "Bearer dev-admin:root"}
        )
    after = set(valkey_server.conversation_keys())
    receipt = erased.json()
    assert erased.status_code == 200 and receipt["entries"] == 2
    assert sorted(k.encode() for k in receipt["keys"]) == sorted(before - after)
    assert len(after) == 2 and all(
        k.startswith(b"mem:team-a/support:u:") or k.startswith(b"mem:team-b/") for k in after
    )
