"""The launcher's memory endpoint: what the launcher decides on its own (headers relayed, refusals before the
proxy, spans), checked against the real proxy or a real recording upstream."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from sessionmem_core import api, env
from sessionmem_core.errors import (
    CapabilityNotAccepted,
    TurnNotLive,
    Unauthenticated,
    UserCapabilityRequired,
    from_wire,
)
from sessionmem_launcher.server import Launcher
from tests.conftest import launcher_settings
from tests.support.conversations import exchange
from tests.support.items import SHAPES
from tests.support.processes import ServiceProcess
from tests.support.serving import serve_in_background

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Recorder:
    """A stand-in proxy that keeps the headers of every request it gets and answers like the proxy."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        await receive()
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.requests.append((scope["method"], scope["path"], headers))
        answer = [(b"content-type", b"application/json"), (api.SCOPE_HEADER.encode(), b"session")]
        await send({"type": "http.response.start", "status": 200, "headers": answer})
        await send({"type": "http.response.body", "body": b'{"ok":true}'})


@pytest.fixture
async def recording_launcher(
    dev_token_file: Path, span_exporter: InMemorySpanExporter
) -> AsyncIterator[tuple[Recorder, Launcher]]:
    """A launcher whose proxy is a ``Recorder``; yields both."""
    recorder = Recorder()
    upstream = await serve_in_background(recorder)
    settings = launcher_settings(f"http://127.0.0.1:{upstream.port}", dev_token_file)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    launcher = Launcher(settings, tracer_provider=provider, serve_host="127.0.0.1", serve=serve_in_background)
    await launcher.start()
    yield recorder, launcher
    await launcher.stop()
    await upstream.stop()


@contextlib.asynccontextmanager
async def _memory_client(upstream_app: Any, token_file: Path, **environ: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the memory endpoint of a launcher whose proxy is ``upstream_app``."""
    upstream = await serve_in_background(upstream_app)
    settings = launcher_settings(f"http://127.0.0.1:{upstream.port}", token_file, **environ)
    launcher = Launcher(settings, serve_host="127.0.0.1", serve=serve_in_background)
    await launcher.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.memory_port}") as client:
            yield client
    finally:
        await launcher.stop()
        await upstream.stop()


@pytest.fixture
def recorded(recording_launcher: tuple[Recorder, Launcher]) -> tuple[Recorder, str]:
    """The ``Recorder`` and the launcher's memory URL."""
    recorder, launcher = recording_launcher
    return recorder, f"http://127.0.0.1:{launcher.memory_port}"


async def test_only_the_allow_listed_headers_reach_the_proxy(
    recording_launcher: tuple[Recorder, Launcher], dev_token_file: Path
) -> None:
    recorder, launcher = recording_launcher
    url = f"http://127.0.0.1:{launcher.memory_port}"
    sent = {
        "traceparent": TRACEPARENT,
        "tracestate": "vendor=1",
        "if-match": "7",
        "idempotency-key": "turn-7",
        "authorization": "Bearer dev:team-b/billing-agent",
        "x-sessionmem-agent": "billing-agent",
        "x-user-id": "mallory",
        "cookie": "session=1",
        "x-forwarded-for": "10.0.0.1",
    }
    with launcher.turns.bound("cap-value") as turn:
        sent[api.TURN_HEADER] = turn
        async with httpx.AsyncClient(base_url=url) as client:
            response = await client.put("/v1/conversations/c1?scope=shared", json=exchange("a"), headers=sent)
    assert response.status_code == 200 and response.json() == {"ok": True}
    assert response.headers["content-type"] == "application/json"
    assert response.headers["content-length"] == str(len(response.content))
    [(method, path, headers)] = recorder.requests
    assert (method, path) == ("PUT", "/v1/conversations/c1")
    assert headers["authorization"] == f"Bearer {dev_token_file.read_text().strip()}", (
        "the pod's token, not the agent's"
    )
    assert headers[api.USER_CAPABILITY_HEADER] == "cap-value", "the turn's capability, resolved by the launcher"
    assert headers["if-match"] == "7"
    assert headers["idempotency-key"] == "turn-7"
    assert headers["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1], "the launcher's span, same trace"
    assert headers["tracestate"] == "vendor=1"
    assert set(headers) == {
        "host",
        "content-type",
        "content-length",
        "traceparent",
        "tracestate",
        "authorization",
        api.USER_CAPABILITY_HEADER,
        "if-match",
        "idempotency-key",
    }


async def test_a_capability_or_a_dead_turn_sent_by_the_agent_never_reaches_the_proxy(
    recording_launcher: tuple[Recorder, Launcher], span_exporter: InMemorySpanExporter
) -> None:
    recorder, launcher = recording_launcher
    with launcher.turns.bound("cap-value") as turn:
        pass
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.memory_port}") as client:
        capability = await client.get("/v1/conversations/c1/entries", headers={api.USER_CAPABILITY_HEADER: "x"})
        with launcher.turns.bound("cap-value") as live:  # a live handle does not make a capability acceptable
            both = {api.USER_CAPABILITY_HEADER: "x", api.TURN_HEADER: live}
            beside = await client.post("/v1/conversations/c1/entries", json=exchange("a"), headers=both)
        dead = await client.delete("/v1/users/me/conversations", headers={api.TURN_HEADER: turn})
    for refused in (capability, beside):
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "capability_not_accepted"
        assert isinstance(from_wire(refused.status_code, refused.content), CapabilityNotAccepted)
    assert dead.status_code == 401 and isinstance(from_wire(dead.status_code, dead.content), TurnNotLive)
    assert recorder.requests == [], "none of these reached the proxy"
    # Each refusal fails its operation's span, so an agent replaying handles shows in the traces.
    spans = [
        (s.name, dict(s.attributes or {})["memory.outcome"], s.status.status_code)
        for s in span_exporter.get_finished_spans()
    ]
    assert spans == [
        ("memory.get", "capability_not_accepted", StatusCode.ERROR),
        ("memory.append", "capability_not_accepted", StatusCode.ERROR),
        ("memory.erase_user", "turn_not_live", StatusCode.ERROR),
    ]


async def test_unrouted_requests_health_and_head_are_answered_as_before(recorded: tuple[Recorder, str]) -> None:
    recorder, url = recorded
    async with httpx.AsyncClient(base_url=url) as client:
        health = await client.get("/healthz")
        unknown = await client.get("/v1/nowhere")
        head = await client.head("/v1/conversations/c1/entries")
        wrong_method = await client.patch("/v1/conversations/c1/entries", content=b"{}")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found"
    assert head.status_code == 404 and head.content == b"" and int(head.headers["content-length"]) > 0
    assert wrong_method.status_code == 404 and wrong_method.json()["error"]["type"] == "not_found"
    assert recorder.requests == [], "none of these reached the proxy"


@pytest.mark.parametrize("method", ["POST", "PUT"])
async def test_an_empty_append_or_replace_is_a_typed_400_in_its_span(
    recorded: tuple[Recorder, str], span_exporter: InMemorySpanExporter, method: str
) -> None:
    recorder, url = recorded
    path = "/v1/conversations/c1/entries" if method == "POST" else "/v1/conversations/c1"
    async with httpx.AsyncClient(base_url=url) as client:
        response = await client.request(method, path)
    assert response.status_code == 400
    assert response.json()["error"] == {"type": "invalid_request", "message": "request body is required"}
    assert recorder.requests == []
    [span] = span_exporter.get_finished_spans()
    assert span.name == ("memory.append" if method == "POST" else "memory.replace")
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["memory.outcome"] == "invalid_request"


async def _chunks(body: bytes, size: int) -> AsyncIterator[bytes]:
    """A body sent chunked (no Content-Length): the limit holds while it streams."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


async def test_a_body_over_the_configured_limit_is_a_typed_413_in_its_span(
    proxy_process: ServiceProcess, dev_token_file: Path, span_exporter: InMemorySpanExporter
) -> None:
    limit = 4096
    settings = launcher_settings(proxy_process.base_url, dev_token_file, **{env.MAX_REQUEST_BODY_BYTES: str(limit)})
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    launcher = Launcher(settings, tracer_provider=provider, serve_host="127.0.0.1", serve=serve_in_background)
    await launcher.start()
    fits = orjson.dumps({"entries": [{"role": "user", "content": "x" * (limit - 100)}]})
    over = orjson.dumps({"entries": [{"role": "user", "content": "x" * limit}]})
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.memory_port}") as http:
            stored = await http.post("/v1/conversations/big/entries", content=fits)
            refused = await http.post("/v1/conversations/big/entries", content=over)
            chunked = await http.post("/v1/conversations/big/entries", content=_chunks(over, 2000))
    finally:
        await launcher.stop()
    assert len(fits) <= limit < len(over)
    assert stored.status_code == 200
    for response in (refused, chunked):
        assert response.status_code == 413 and response.json()["error"]["type"] == "payload_too_large"
    spans = span_exporter.get_finished_spans()
    assert [s.name for s in spans] == ["memory.append"] * 3
    for span in spans[1:]:
        assert span.status.status_code is StatusCode.ERROR
        assert dict(span.attributes or {})["memory.outcome"] == "payload_too_large"


async def test_an_error_answer_of_the_proxy_passes_through_and_fails_the_span(
    launcher: Launcher, span_exporter: InMemorySpanExporter
) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.memory_port}") as client:
        response = await client.get("/v1/conversations/c1/entries?limit=-1")
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request"
    [span] = span_exporter.get_finished_spans()
    assert span.name == "memory.get" and span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["memory.outcome"] == "invalid_request"


def _comparable(response: httpx.Response) -> tuple[int, Any]:
    """Status and body, without what differs between two conversations written a moment apart."""
    body = response.json()
    body.pop("conversationId", None)
    for listed in ("entries", "matches"):
        for entry in body.get(listed, []) if isinstance(body.get(listed), list) else []:
            entry.pop("ts")
            entry.pop("life", None)  # each conversation's own random id
    return response.status_code, body


async def test_the_endpoint_answers_what_the_proxy_answers(launcher: Launcher, proxy_process: ServiceProcess) -> None:
    # The launcher passes the proxy's status and body through, and refuses on its own only what the proxy
    # would refuse the same way; the proxy is asked directly with the token the launcher uses.
    token = {"authorization": f"Bearer {Path(launcher.settings.token_path).read_text().strip()}"}
    answers = []
    for base, headers, conversation in (
        (f"http://127.0.0.1:{launcher.memory_port}", {}, "via-launcher"),
        (proxy_process.base_url, token, "via-proxy000"),
    ):
        async with httpx.AsyncClient(base_url=base, headers=headers) as http:
            calls = [
                await http.post(f"/v1/conversations/{conversation}/entries", json=exchange("t")),
                await http.get(f"/v1/conversations/{conversation}/entries?limit=5"),
                await http.get(f"/v1/conversations/{conversation}/search?q=t"),
                await http.get(f"/v1/conversations/{conversation}/entries?limit=-1"),
                await http.get("/v1/conversations/bad:id/entries"),
                await http.delete(f"/v1/conversations/{conversation}"),
            ]
        answers.append([_comparable(r) for r in calls])
    assert answers[0] == answers[1]


async def test_an_id_whose_escapes_are_not_utf8_is_refused_not_merged(recorded: tuple[Recorder, str]) -> None:
    # The server hands the launcher a decoded path, with U+FFFD where escapes were not UTF-8: "a%FF" and
    # "a%EF%BF%BD" would reach one conversation, so neither is forwarded.
    recorder, url = recorded
    async with httpx.AsyncClient(base_url=url) as client:
        answers = [await client.get(f"/v1/conversations/{raw}/entries") for raw in ("a%FF", "a%C0%AF", "a%EF%BF%BD")]
        fine = await client.get("/v1/conversations/a%C3%A9/entries")
    for answer in answers:
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_conversation_id"
    assert fine.status_code == 200
    assert [path for _, path, _ in recorder.requests] == ["/v1/conversations/aé/entries"]


async def test_a_per_user_agent_without_a_capability_is_refused_as_the_client_expects(
    dev_token_file: Path,
) -> None:
    recorder = Recorder()
    async with _memory_client(recorder, dev_token_file, **{env.PER_USER: "true"}) as client:
        refused = await client.get("/v1/conversations/c1/entries")
    assert refused.status_code == 401 and recorder.requests == []
    error = from_wire(refused.status_code, refused.content)
    assert isinstance(error, UserCapabilityRequired) and isinstance(error, Unauthenticated)


class PagedExports:
    """A stand-in proxy answering exports two entries a page, as the proxy pages them; a write lands
    between the pages of the first export it serves (the version moves on, the entries shift)."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.stored = ["a", "b", "c"]
        self.version = 1

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        await receive()
        query = dict(api.parse_query(scope["query_string"].decode()))
        offset = int(query.get(api.OFFSET_PARAM, "0"))
        self.offsets.append(offset)
        if self.offsets == [0, 2]:
            self.stored.insert(0, "new")  # as if the cap trimmed and appended meanwhile
            self.version += 1
        end = min(offset + 2, len(self.stored))
        page = {
            "conversationId": "c",
            "scope": "session",
            "version": self.version,
            "entries": [
                {"id": f"m{value}", "role": "user", "content": value, "ts": 1} for value in self.stored[offset:end]
            ],
            "nextOffset": end if end < len(self.stored) else None,
        }
        answer = [(b"content-type", b"application/json"), (api.SCOPE_HEADER.encode(), b"session")]
        await send({"type": "http.response.start", "status": 200, "headers": answer})
        await send({"type": "http.response.body", "body": orjson.dumps(page)})


async def test_an_export_joins_the_proxys_pages_and_starts_over_when_they_disagree(dev_token_file: Path) -> None:
    proxy = PagedExports()
    async with _memory_client(proxy, dev_token_file) as client:
        answer = await client.get("/v1/conversations/c/export?offset=1")
    assert answer.status_code == 200
    document = answer.json()
    assert [entry["content"] for entry in document["entries"]] == ["new", "a", "b", "c"]
    assert document["version"] == 2 and document["nextOffset"] is None
    # The agent's offset is not the proxy's: each export starts at 0; the first was dropped at its second page.
    assert proxy.offsets == [0, 2, 0, 2]


async def test_items_and_the_idempotency_key_pass_through_the_launcher_unchanged(launcher: Launcher) -> None:
    """An agent's framework session on the memory endpoint: its items come back as given, and its retry
    (the same Idempotency-Key, fresh ids) is answered as the original was."""
    entries = [
        {"role": role, "content": content, "item": item, "id": f"i{n}"}
        for n, (role, content, item) in enumerate(SHAPES.values())
    ]
    retry = [{k: v for k, v in entry.items() if k != "id"} for entry in entries]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.memory_port}") as client:
        first = await client.post(
            "/v1/conversations/sdk/entries", json={"entries": entries}, headers={"Idempotency-Key": "run-1:turn-1"}
        )
        again = await client.post(
            "/v1/conversations/sdk/entries", json={"entries": retry}, headers={"Idempotency-Key": "run-1:turn-1"}
        )
        read = await client.get("/v1/conversations/sdk/entries?limit=100")
    assert first.status_code == 200, first.text
    assert (again.json()["duplicate"], again.json()["stored"], again.json()["version"]) == (True, 0, 1)
    got = orjson.loads(read.content)["entries"]
    assert [orjson.dumps(e["item"]) for e in got] == [orjson.dumps(e["item"]) for e in entries]
    assert [e["id"] for e in got] == [e["id"] for e in entries]


async def test_the_conversation_operations_pass_through_the_launcher(launcher: Launcher) -> None:
    """pop (with If-Match), rewind, fork, compact, the catalogue and its metadata on the memory endpoint,
    as the proxy serves them."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.memory_port}") as client:
        for turn in ("t1", "t2", "t3"):
            await client.post("/v1/conversations/ops/entries", json=exchange(turn))
        stale = await client.post("/v1/conversations/ops/pop", headers={"If-Match": "1"})
        popped = await client.post("/v1/conversations/ops/pop", headers={"If-Match": "3"})
        rewound = await client.post("/v1/conversations/ops/rewind", json={"toVersion": 1})
        forked = await client.post("/v1/conversations/ops/fork", json={"conversationId": "ops-branch"})
        compacted = await client.post(
            "/v1/conversations/ops/compact",
            json={"summary": {"role": "system", "content": "said hi"}, "throughVersion": 1},
        )
        titled = await client.patch("/v1/conversations/ops/metadata", json={"title": "greetings"})
        listed = (await client.get("/v1/conversations")).json()["conversations"]
    assert stale.status_code == 412 and stale.json()["error"]["type"] == "version_conflict"
    assert (popped.json()["entry"]["id"], popped.json()["version"]) == ("t3-a", 4)
    assert rewound.json()["removed"] == 3 and rewound.json()["version"] == 5
    assert forked.json() == {"conversationId": "ops-branch", "version": 1, "entries": 2, "scope": "session"}
    assert compacted.json() == {"version": 5, "scope": "session"}, compacted.text
    assert titled.json()["title"] == "greetings", titled.text
    assert [c["conversationId"] for c in listed] == ["ops-branch", "ops"]


async def test_a_conditional_append_passes_through_the_launcher(launcher: Launcher) -> None:
    """If-Match on an append reaches the proxy: a stale version is its 412, the current one stores."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.memory_port}") as client:
        first = await client.post("/v1/conversations/cond/entries", json=exchange("t1"), headers={"If-Match": "0"})
        stale = await client.post("/v1/conversations/cond/entries", json=exchange("t2"), headers={"If-Match": "0"})
        current = await client.post("/v1/conversations/cond/entries", json=exchange("t2"), headers={"If-Match": "1"})
        read = (await client.get("/v1/conversations/cond/entries")).json()
    assert first.json()["version"] == 1, first.text
    assert stale.status_code == 412 and from_wire(stale.status_code, stale.content).error_type == "version_conflict"
    assert current.json()["version"] == 2, current.text
    assert [e["id"] for e in read["entries"]] == ["t1-u", "t1-a", "t2-u", "t2-a"]


async def test_conditional_reads_pass_through_the_launcher(launcher: Launcher) -> None:
    """If-None-Match and Prefer reach the proxy, and its 304 (no body, no content type) and ETags come back:
    for a read, an append that answers its entries, and an export joined from several pages."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.memory_port}") as http:
        url = api.entries_path("cond") + "?limit=40"
        appended = await http.post(
            api.entries_path("cond"), json=exchange("t"), headers={"Prefer": api.RETURN_REPRESENTATION}
        )
        assert [e["id"] for e in appended.json()["entries"]] == ["t-u", "t-a"]
        read = await http.get(url)
        assert read.headers["etag"] == appended.headers["etag"]
        unchanged = await http.get(url, headers={"If-None-Match": read.headers["etag"]})
        assert (unchanged.status_code, unchanged.content) == (304, b"")
        assert unchanged.headers["etag"] == read.headers["etag"] and "content-type" not in unchanged.headers
        # Two pages at least: six entries of about a quarter of a page each.
        for n in range(6):
            body = {"entries": [{"role": "user", "content": "x" * env.MAX_CONTENT_CHARS, "id": f"big-{n}"}]}
            assert (await http.post(api.entries_path("pages"), json=body)).status_code == 200
        export = await http.get(api.export_path("pages"))
        assert len(export.json()["entries"]) == 6 and export.headers["etag"]
        again = await http.get(api.export_path("pages"), headers={"If-None-Match": export.headers["etag"]})
        assert (again.status_code, again.content) == (304, b"")
        await http.post(api.entries_path("pages"), json={"entries": [{"role": "user", "content": "more"}]})
        changed = await http.get(api.export_path("pages"), headers={"If-None-Match": export.headers["etag"]})
        assert changed.status_code == 200 and len(changed.json()["entries"]) == 7
        assert changed.headers["etag"] != export.headers["etag"]
