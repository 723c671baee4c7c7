"""The launcher between an agent and the real proxy: forwarding with the pod's identity, typed errors,
fail-open managed loop, and exactly one ``memory.*`` span per operation under the caller's trace."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import httpx
import orjson
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sessionmem_core import api, env
from sessionmem_core.keys import Owner, session_key
from sessionmem_launcher.server import Launcher
from tests.conftest import launcher_settings
from tests.support.conversations import BAD_IDS, bad_id_error, exchange
from tests.support.processes import ServiceProcess
from tests.support.serving import serve_in_background
from tests.support.valkey import ValkeyProcess, free_port

OWNER = Owner(namespace="team-a", agent="support-agent")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def memory_url(launcher: Launcher) -> str:
    return f"http://127.0.0.1:{launcher.memory_port}"


def serve_url(launcher: Launcher) -> str:
    return f"http://127.0.0.1:{launcher.serve_port}"


@pytest.mark.parametrize("bad_id", BAD_IDS.values(), ids=BAD_IDS.keys())
async def test_every_bad_conversation_id_is_a_typed_400_at_the_launcher(launcher: Launcher, bad_id: str) -> None:
    async with httpx.AsyncClient(base_url=memory_url(launcher)) as client:
        for method, path in (
            ("GET", f"/v1/conversations/{bad_id}/entries"),
            ("POST", f"/v1/conversations/{bad_id}/entries"),
            ("DELETE", f"/v1/conversations/{bad_id}"),
        ):
            body = orjson.dumps(exchange("x")) if method == "POST" else None
            response = await client.request(method, path, content=body)
            assert response.status_code == 400, (method, path, response.text)
            assert response.json()["error"]["type"] == bad_id_error(bad_id)


async def test_a_bad_conversation_id_header_is_a_typed_400_in_the_managed_loop(launcher: Launcher) -> None:
    async with httpx.AsyncClient(base_url=serve_url(launcher)) as client:
        for bad in ("", "x" * 129, "a/b", "a:b", "a b"):
            response = await client.post("/", json={"input": "hi"}, headers={"X-Conversation-Id": bad})
            assert response.status_code == 400, bad
            assert response.json()["error"]["type"] == "invalid_conversation_id"


async def test_body_over_one_mebibyte_is_413_at_the_launcher(launcher: Launcher) -> None:
    big = {"entries": [{"role": "user", "content": "x" * (1024 * 1024)}]}
    async with httpx.AsyncClient(base_url=memory_url(launcher)) as client:
        response = await client.post("/v1/conversations/big/entries", json=big)
    assert response.status_code == 413 and response.json()["error"]["type"] == "payload_too_large"


async def test_identity_headers_set_by_the_agent_change_nothing(
    launcher: Launcher, valkey_server: ValkeyProcess
) -> None:
    forged = {
        "Authorization": "Bearer dev:team-b/billing-agent",
        "X-Sessionmem-Agent": "billing-agent",
        "X-Sessionmem-Namespace": "team-b",
        "X-User-Id": "mallory",
    }
    async with httpx.AsyncClient(base_url=memory_url(launcher)) as client:
        response = await client.post("/v1/conversations/c1/entries?scope=shared", json=exchange("a"), headers=forged)
        history = (await client.get("/v1/conversations/c1/entries", headers=forged)).json()
    assert response.status_code == 200 and response.json()["scope"] == "session"
    assert {e["author"] for e in history["entries"]} == {"team-a/support-agent"}
    assert valkey_server.client().llen(session_key(OWNER, "c1")) == 2
    assert valkey_server.client().keys("mem:team-b*") == []


async def test_managed_loop_replays_and_appends(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    headers = {"X-Conversation-Id": "chat-1"}
    async with httpx.AsyncClient(base_url=serve_url(launcher)) as client:
        first = await client.post("/invoke", json={"input": "Hello, my name is Ada"}, headers=headers)
        second = await client.post("/invoke", json={"input": "What is my name?"}, headers=headers)
        single_shot = await client.post("/invoke", json={"input": "What is my name?"})
    assert first.json()["output"].startswith("Nice to meet you, Ada")
    assert first.headers["x-sessionmem-memory"] == "ok"
    assert second.json() == {"output": "Your name is Ada.", "historySeen": 2}
    assert single_shot.json() == {"output": "I don't know your name yet.", "historySeen": 0}
    stored = [orjson.loads(r) for r in valkey_server.client().lrange(session_key(OWNER, "chat-1"), 0, -1)]
    assert [(e["role"], e["content"]) for e in stored] == [
        ("user", "Hello, my name is Ada"),
        ("assistant", "Nice to meet you, Ada! I'll remember that."),
        ("user", "What is my name?"),
        ("assistant", "Your name is Ada."),
    ]
    assert len(valkey_server.conversation_keys()) == 1, "a turn without X-Conversation-Id stores nothing"


async def test_valkey_stopped_gives_typed_503_fast_and_the_loop_still_answers(
    launcher: Launcher, valkey_server: ValkeyProcess, proxy_process: ServiceProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sessionmem.launcher")
    headers = {"X-Conversation-Id": "outage"}
    async with httpx.AsyncClient(timeout=10) as client:
        await client.post(f"{serve_url(launcher)}/", json={"input": "my name is Grace"}, headers=headers)
        valkey_server.stop()
        for method, path, body in (
            ("GET", "/v1/conversations/outage/entries", None),
            ("POST", "/v1/conversations/outage/entries", orjson.dumps(exchange("x"))),
        ):
            started = time.monotonic()
            response = await client.request(method, memory_url(launcher) + path, content=body)
            elapsed = time.monotonic() - started
            assert response.status_code == 503 and response.json()["error"]["type"] == "backend_unavailable"
            assert elapsed < 2.0, f"{method} took {elapsed:.2f}s"
        turn = await client.post(f"{serve_url(launcher)}/", json={"input": "what is my name?"}, headers=headers)
        assert turn.status_code == 200
        assert turn.json()["output"] == "I don't know your name yet."
        assert turn.headers["x-sessionmem-memory"] == "unavailable"

        valkey_server.start()  # empty: this server does not persist
        again = await client.post(f"{serve_url(launcher)}/", json={"input": "my name is Linus"}, headers=headers)
        recalled = await client.post(f"{serve_url(launcher)}/", json={"input": "what is my name?"}, headers=headers)
    assert again.headers["x-sessionmem-memory"] == "ok"
    assert recalled.json()["output"] == "Your name is Linus."
    # Three failed calls, one line: memory down, with the proxy's address and the backend's cause; one when back.
    lines = [r.getMessage() for r in caplog.records if r.name == "sessionmem.launcher"]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"memory (the proxy) at {proxy_process.base_url} is down: the proxy answered 503")
    assert "memory backend unavailable" in lines[0]
    assert lines[1] == f"memory (the proxy) at {proxy_process.base_url} is up again"


async def test_proxy_unreachable_is_a_typed_503_within_the_bound(
    launcher: Launcher, proxy_process: object, dev_token_file: object
) -> None:
    from tests.support.processes import ServiceProcess

    assert isinstance(proxy_process, ServiceProcess)
    proxy_process.stop()
    async with httpx.AsyncClient(base_url=memory_url(launcher), timeout=10) as client:
        started = time.monotonic()
        response = await client.get("/v1/conversations/c1/entries")
        elapsed = time.monotonic() - started
        turn = await client.post(f"{serve_url(launcher)}/", json={"input": "hi"}, headers={"X-Conversation-Id": "c1"})
    assert response.status_code == 503 and response.json()["error"]["type"] == "backend_unavailable"
    assert elapsed < 2.0
    assert turn.status_code == 200 and turn.headers["x-sessionmem-memory"] == "unavailable"


async def test_memory_spans_are_parented_under_the_callers_traceparent(
    launcher: Launcher, span_exporter: InMemorySpanExporter
) -> None:
    headers = {"traceparent": TRACEPARENT}
    async with httpx.AsyncClient(base_url=memory_url(launcher)) as client:
        await client.post("/v1/conversations/traced/entries", json=exchange("a"), headers=headers)
        await client.get("/v1/conversations/traced/entries?limit=10", headers=headers)
    spans = span_exporter.get_finished_spans()
    assert [s.name for s in spans] == ["memory.append", "memory.get"], "one span per operation, no others"
    for span in spans:
        assert span.context is not None and span.parent is not None
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    append, get = (dict(s.attributes or {}) for s in spans)
    assert append["memory.scope"] == "session" and append["memory.entries"] == 2 and append["memory.version"] == 1
    assert append["memory.outcome"] == "ok" and isinstance(append["memory.latency_ms"], float)
    assert append["memory.latency_ms"] > 0
    assert get["memory.entries"] == 2 and get["memory.version"] == 1 and get["memory.outcome"] == "ok"
    # OpenTelemetry's GenAI names beside memory.*: the conversation, and the memory operation.
    assert append["gen_ai.conversation.id"] == get["gen_ai.conversation.id"] == "traced"
    assert (append["gen_ai.operation.name"], get["gen_ai.operation.name"]) == ("update_memory", "search_memory")


async def test_managed_loop_spans_join_the_callers_trace(
    launcher: Launcher, span_exporter: InMemorySpanExporter
) -> None:
    async with httpx.AsyncClient(base_url=serve_url(launcher)) as client:
        await client.post("/", json={"input": "hi"}, headers={"X-Conversation-Id": "t2", "traceparent": TRACEPARENT})
    spans = span_exporter.get_finished_spans()
    assert [s.name for s in spans] == ["memory.get", "memory.append"]
    assert all(s.context is not None and format(s.context.trace_id, "032x") == TRACE_ID for s in spans)


async def test_the_serving_port_is_ready_only_while_the_agent_listens(
    proxy_process: ServiceProcess, dev_token_file: Path
) -> None:
    """The operator's readiness probe: a pod takes turns only once its agent accepts connections."""
    agent_port = free_port()
    settings = launcher_settings(proxy_process.base_url, dev_token_file, **{env.AGENT_PORT: str(agent_port)})
    instance = Launcher(settings, serve_host="127.0.0.1", serve=serve_in_background)
    await instance.start()
    try:
        ready_url = f"http://127.0.0.1:{instance.serve_port}{api.AGENT_READY_PATH}"
        async with httpx.AsyncClient(timeout=api.AGENT_READY_WAIT_SECONDS + 5) as client:
            before = await client.get(ready_url)  # after waiting api.AGENT_READY_WAIT_SECONDS for it
            listener = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", agent_port)
            try:
                after = await client.get(ready_url)
            finally:
                listener.close()
                await listener.wait_closed()
    finally:
        await instance.stop()
    assert before.status_code == 502 and before.json()["error"]["type"] == "agent_unavailable"
    assert after.status_code == 200


async def test_readiness_waits_for_an_agent_that_is_starting_instead_of_failing(
    proxy_process: ServiceProcess, dev_token_file: Path
) -> None:
    """A probe sent while the agent starts succeeds once it listens: no failed probe (a Warning Event on
    every pod start) for an agent that comes up within api.AGENT_READY_WAIT_SECONDS."""
    agent_port = free_port()
    settings = launcher_settings(proxy_process.base_url, dev_token_file, **{env.AGENT_PORT: str(agent_port)})
    instance = Launcher(settings, serve_host="127.0.0.1", serve=serve_in_background)
    await instance.start()
    try:
        ready_url = f"http://127.0.0.1:{instance.serve_port}{api.AGENT_READY_PATH}"
        async with httpx.AsyncClient(timeout=api.AGENT_READY_WAIT_SECONDS + 5) as client:
            probe = asyncio.create_task(client.get(ready_url))
            await asyncio.sleep(1.0)  # the agent is still starting
            assert not probe.done()
            listener = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", agent_port)
            try:
                answer = await probe
            finally:
                listener.close()
                await listener.wait_closed()
    finally:
        await instance.stop()
    assert answer.status_code == 200


async def _relay(port: int, to_port: int) -> asyncio.Server:
    """A TCP relay on ``port`` to ``to_port``: the proxy's address once the pod's is admitted."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", to_port)
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    return await asyncio.start_server(relay, "127.0.0.1", port)


async def test_a_pods_first_ready_answer_waits_for_the_proxy_so_its_first_turn_has_memory(
    proxy_process: ServiceProcess, dev_token_file: Path, demo_agent: int
) -> None:
    """A new pod's connections may be refused for its first seconds (a NetworkPolicy agent such as
    kube-router admits its address late): the first ready answer waits for the proxy to answer, so the turn
    that waited for it (Knative's activator holds a cold pod's first turn until then) is taken with memory."""
    proxy_port = free_port()  # refused until the relay listens there
    settings = launcher_settings(f"http://127.0.0.1:{proxy_port}", dev_token_file, **{env.AGENT_PORT: str(demo_agent)})
    instance = Launcher(settings, serve_host="127.0.0.1", serve=serve_in_background)
    await instance.start()
    relay: asyncio.Server | None = None
    try:
        async with httpx.AsyncClient(base_url=serve_url(instance), timeout=api.AGENT_READY_WAIT_SECONDS + 5) as client:
            probe = asyncio.create_task(client.get(api.AGENT_READY_PATH))
            await asyncio.sleep(0.5)
            assert not probe.done(), "the pod said ready while the proxy refused it"
            relay = await _relay(proxy_port, int(proxy_process.base_url.rsplit(":", 1)[1]))
            ready = await probe
            answer = await client.post(
                "/", json={"input": "Hi, my name is Grace"}, headers={"X-Conversation-Id": "cold"}
            )
    finally:
        if relay is not None:
            relay.close()
        await instance.stop()
    assert ready.status_code == 200
    assert answer.status_code == 200 and answer.headers[api.MEMORY_STATUS_HEADER] == "ok"


async def test_a_proxy_that_never_answers_leaves_the_pod_ready_without_memory(
    dev_token_file: Path, demo_agent: int
) -> None:
    """Fail-open: the first ready answer waits for the proxy only within the readiness wait; the pod then
    takes turns, answered without memory."""
    settings = launcher_settings(f"http://127.0.0.1:{free_port()}", dev_token_file, **{env.AGENT_PORT: str(demo_agent)})
    instance = Launcher(settings, serve_host="127.0.0.1", serve=serve_in_background)
    await instance.start()
    try:
        async with httpx.AsyncClient(base_url=serve_url(instance), timeout=api.AGENT_READY_WAIT_SECONDS + 5) as client:
            first = await client.get(api.AGENT_READY_PATH)
            answer = await client.post("/", json={"input": "hi"}, headers={"X-Conversation-Id": "no-memory"})
    finally:
        await instance.stop()
    assert first.status_code == 200
    assert answer.status_code == 200 and answer.headers[api.MEMORY_STATUS_HEADER] == "unavailable"


async def test_spans_of_calls_the_launcher_refuses_itself_carry_the_scope(
    launcher: Launcher, span_exporter: InMemorySpanExporter
) -> None:
    """A bad id, a write without a body, a turn handle that is not live: each refused by the launcher before
    anything reaches the proxy, each a failed span that still says which scope was asked for."""
    async with httpx.AsyncClient(base_url=memory_url(launcher)) as client:
        bad_id = await client.get("/v1/conversations/a:b/entries")
        no_body = await client.post("/v1/conversations/c/entries")
        dead_turn = await client.get("/v1/conversations/c/entries", headers={api.TURN_HEADER: "not-live"})
    assert [r.status_code for r in (bad_id, no_body, dead_turn)] == [400, 400, 401]
    spans = [dict(s.attributes or {}) for s in span_exporter.get_finished_spans()]
    assert len(spans) == 3
    for attributes in spans:
        assert attributes["memory.outcome"] != "ok" and attributes["memory.scope"] == "session", attributes
