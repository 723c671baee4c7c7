"""The Python client against the real stack (in-process launcher -> real proxy process -> real
valkey-server): round trips sync and async, ids checked before the network, typed errors, headers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sessionmem_client import (
    AsyncMemoryClient,
    BackendUnavailable,
    EntryIn,
    InvalidConversationId,
    InvalidMessageId,
    InvalidRequest,
    MemoryClient,
    PayloadTooLarge,
    Role,
    SessionMemError,
    TurnNotLive,
    Unauthenticated,
    VersionConflict,
    default_base_url,
    new_conversation_id,
)
from sessionmem_client._requests import EntryFields
from sessionmem_core import api, env, wire
from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner, is_valid_id, session_key
from sessionmem_launcher.server import Launcher
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess, free_port

T = TypeVar("T")
OWNER = Owner(namespace="team-a", agent="support-agent")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"

# Raw ids (not URL-encoded): each breaks the contract's rule.
BAD_IDS = {
    "empty": "",
    "129 characters": "x" * 129,
    "slash": "a/b",
    "colon": "a:b",
    "space": "a b",
    "tab": "a\tb",
    "newline": "a\nb",
    "control character": "a\x01b",
    "DEL": "a\x7fb",
    "C1 control": "a\x85b",
    "no-break space": "a\u00a0b",
    "line separator": "a\u2028b",
    "dot": ".",
    "dot dot": "..",
}

# Valid ids that must be percent-encoded to be addressed (the contract's path builders do it), on both
# hops: client -> launcher and launcher -> proxy.
AWKWARD_IDS = [
    "a?b",
    "a#b",
    "x%2Fy",
    "50%",
    "semi;colon",
    "caf\u00e9",
    "emoji-\U0001f600",
    "a&b=c",
    "~tilde",
    "x" * 128,
]


async def in_thread(fn: Callable[[], T]) -> T:
    """Sync clients run in a worker thread: the launcher under test serves from this event loop."""
    return await asyncio.to_thread(fn)


def memory_url(launcher: Launcher) -> str:
    return f"http://127.0.0.1:{launcher.memory_port}"


def stored(valkey: ValkeyProcess, conversation_id: str) -> list[dict[str, Any]]:
    """What Valkey holds for the conversation, read directly."""
    return [orjson.loads(raw) for raw in valkey.client().lrange(session_key(OWNER, conversation_id), 0, -1)]


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


# --- round trips ---


async def test_sync_client_round_trip(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    cid = new_conversation_id()

    def scenario() -> None:
        with MemoryClient(memory_url(launcher)) as memory:
            first = memory.append_exchange(cid, "My name is Ada", "Hello Ada", turn_id="t1")
            assert (first.version, first.stored, first.duplicate, first.length) == (1, 2, False, 2)
            assert first.scope == "session"
            retry = memory.append_exchange(cid, "My name is Ada", "Hello Ada", turn_id="t1")
            assert (retry.version, retry.stored, retry.duplicate) == (1, 0, True), "a retried exchange is stored once"
            memory.append(
                cid,
                [{"role": "user", "content": "I drink green tea"}, EntryIn(role=Role.ASSISTANT, content="Tea noted")],
            )
            assert [e["id"] for e in stored(valkey_server, cid)][:2] == ["t1-u", "t1-a"]

            history = memory.read(cid)
            assert isinstance(history, wire.History)
            assert history.conversation_id == cid and history.version == 2 and history.scope == "session"
            assert [(e.role, e.content) for e in history.entries] == [
                (Role.USER, "My name is Ada"),
                (Role.ASSISTANT, "Hello Ada"),
                (Role.USER, "I drink green tea"),
                (Role.ASSISTANT, "Tea noted"),
            ]
            assert {e.author for e in history.entries} == {"team-a/support-agent"}, "stamped server-side"
            assert [e.content for e in memory.read(cid, limit=1).entries] == ["Tea noted"]
            assert memory.read(cid, limit=0).entries == [] and memory.read(cid, limit=0).version == 2

            found = memory.search(cid, "tea", limit=5)
            assert isinstance(found, wire.SearchResponse) and found.query == "tea"
            assert [m.content for m in found.matches] == ["Tea noted", "I drink green tea"], "newest first on ties"

            replaced = memory.replace(cid, [{"role": "system", "content": "seeded"}], if_version=history.version)
            assert (replaced.version, replaced.stored) == (3, 1)
            assert [(e["role"], e["content"]) for e in stored(valkey_server, cid)] == [("system", "seeded")]

            gone = memory.delete(cid)
            assert (gone.deleted, gone.entries) == (True, 1)
            assert memory.delete(cid).deleted is False

    await in_thread(scenario)
    assert valkey_server.client().exists(session_key(OWNER, cid)) == 0


async def test_async_client_round_trip(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        first = await memory.append_exchange(cid, "Where is my order 66?", "It ships tomorrow", turn_id="turn-1")
        assert (first.version, first.stored, first.duplicate) == (1, 2, False)
        assert (await memory.append_exchange(cid, "Where is my order 66?", "It ships tomorrow", "turn-1")).duplicate
        await memory.append(cid, [EntryIn(role=Role.USER, content="Thanks", id="m3")])
        raw = stored(valkey_server, cid)
        assert [(e["id"], e["role"], e["v"]) for e in raw] == [
            ("turn-1-u", "user", 1),
            ("turn-1-a", "assistant", 1),
            ("m3", "user", 2),
        ]
        history = await memory.read(cid, limit=2)
        assert [e.id for e in history.entries] == ["turn-1-a", "m3"] and history.version == 2
        found = await memory.search(cid, "order ships")
        assert [m.id for m in found.matches] == ["turn-1-a", "turn-1-u"], "ranked by matching terms"
        replaced = await memory.replace(cid, history.entries, if_version=2)
        assert replaced.version == 3
        assert [e["id"] for e in stored(valkey_server, cid)] == ["turn-1-a", "m3"], "re-seeding keeps entry ids"
        deleted = await memory.delete(cid)
        assert (deleted.deleted, deleted.entries) == (True, 2)
    assert stored(valkey_server, cid) == []


async def test_conversation_operations_through_the_clients(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    """pop, rewind, fork, compact and the catalogue, each through the client as an agent calls them: what
    the server keeps afterwards, read from Valkey, and an item read back and written again kept whole."""
    cid, branch = new_conversation_id(), new_conversation_id()
    call = {"type": "function_call", "name": "lookup", "arguments": '{"q": 1}', "call_id": "c1"}
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        await memory.append(cid, [{"role": "user", "content": "one", "id": "m1"}])
        await memory.append(cid, [{"role": "assistant", "content": "", "id": "m2", "item": call}])
        await memory.append(cid, [{"role": "user", "content": "three", "id": "m3"}])
        popped = await memory.pop(cid, if_version=3)
        assert popped.entry is not None and popped.entry.id == "m3" and popped.length == 2
        with pytest.raises(VersionConflict):
            await memory.pop(cid, if_version=3)  # the pop moved the version on
        forked = await memory.fork(cid, branch, at_version=2)
        assert (forked.conversation_id, forked.entries) == (branch, 2)
        rewound = await memory.rewind(cid, to_version=1)
        assert (rewound.removed, rewound.length) == (1, 1)
        assert [e["id"] for e in stored(valkey_server, cid)] == ["m1"]
        fork_history = await memory.read(branch)
        assert [e.item for e in fork_history.entries] == [None, call]
        await memory.replace(branch, fork_history.entries)
        assert stored(valkey_server, branch)[1]["item"] == call, "an entry read back and re-seeded keeps its item"
        compacted = await memory.compact(branch, {"role": "system", "content": "asked to look up q"}, 3)
        with_summary = await memory.read(branch, summary=True)
        assert with_summary.summary is not None and with_summary.summary.content == "asked to look up q"
        assert with_summary.version == compacted.version and with_summary.entries == []
        assert len((await memory.export(branch)).entries) == 2, "compaction keeps the transcript"

    def catalogue() -> list[str]:
        with MemoryClient(memory_url(launcher)) as memory:
            ref = memory.set_metadata(branch, title="lookup", labels={"topic": "q"})
            assert (ref.title, ref.labels) == ("lookup", {"topic": "q"})
            return [c.conversation_id for c in memory.list_conversations(limit=50).conversations]

    listed = await in_thread(catalogue)
    assert listed.index(branch) < listed.index(cid), "newest write first"


async def test_a_fresh_turn_id_is_minted_per_exchange(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        await memory.append_exchange(cid, "one", "1")
        await memory.append_exchange(cid, "two", "2")
    ids = [e["id"] for e in stored(valkey_server, cid)]
    assert len(ids) == 4 and len(set(ids)) == 4
    assert ids[0].endswith("-u") and ids[1] == ids[0][:-2] + "-a" and ids[2][:-2] != ids[0][:-2]


@pytest.mark.parametrize("conversation_id", AWKWARD_IDS)
async def test_ids_that_need_percent_encoding_reach_their_own_key(
    launcher: Launcher, valkey_server: ValkeyProcess, conversation_id: str
) -> None:
    assert is_valid_id(conversation_id)
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        await memory.append_exchange(conversation_id, "hello", "hi", turn_id="t")
        history = await memory.read(conversation_id)
        assert history.conversation_id == conversation_id
        assert [e.content for e in history.entries] == ["hello", "hi"]
        assert [m.content for m in (await memory.search(conversation_id, "hello")).matches] == ["hello"]
    assert [e["content"] for e in stored(valkey_server, conversation_id)] == ["hello", "hi"]
    assert valkey_server.conversation_keys() == [session_key(OWNER, conversation_id).encode()]


@pytest.mark.parametrize("conversation_id", ["a?b", "a#b", "x%2Fy", "caf\u00e9"])
async def test_the_proxy_itself_serves_ids_that_need_encoding(
    proxy_process: ServiceProcess, valkey_server: ValkeyProcess, conversation_id: str
) -> None:
    # The proxy serves the same API; the client talks to it too when given the credentials the launcher adds.
    token = dev_token(OWNER.namespace, OWNER.agent)
    async with (
        httpx.AsyncClient(headers={"authorization": f"Bearer {token}"}) as http,
        AsyncMemoryClient(proxy_process.base_url, http_client=http) as memory,
    ):
        await memory.append_exchange(conversation_id, "hello", "hi", turn_id="t")
        assert (await memory.read(conversation_id)).conversation_id == conversation_id
    assert [e["content"] for e in stored(valkey_server, conversation_id)] == ["hello", "hi"]


# --- typed errors ---


async def test_a_stale_replace_is_a_version_conflict(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        await memory.append_exchange(cid, "a", "b")
        seen = (await memory.read(cid)).version
        await memory.append_exchange(cid, "c", "d")  # another writer moves the conversation on
        with pytest.raises(VersionConflict) as raised:
            await memory.replace(cid, [{"role": "user", "content": "stale"}], if_version=seen)
        assert raised.value.status == 412 and raised.value.error_type == "version_conflict"
    assert [e["content"] for e in stored(valkey_server, cid)] == ["a", "b", "c", "d"], "nothing was replaced"

    def sync_stale() -> None:
        with MemoryClient(memory_url(launcher)) as sync_memory, pytest.raises(VersionConflict):
            sync_memory.replace(cid, [{"role": "user", "content": "stale"}], if_version=seen)

    await in_thread(sync_stale)
    assert len(stored(valkey_server, cid)) == 4


async def test_a_stale_append_is_a_version_conflict(launcher: Launcher, valkey_server: ValkeyProcess) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        created = await memory.append(cid, [{"role": "user", "content": "a"}], if_version=0)
        with pytest.raises(VersionConflict) as raised:
            await memory.append(cid, [{"role": "user", "content": "stale"}], if_version=0)
        assert raised.value.status == 412 and raised.value.error_type == "version_conflict"
        with pytest.raises(VersionConflict):
            await memory._append_batch(cid, [{"role": "user", "content": "stale"}], "k1", if_version=0)
        await memory._append_batch(cid, [{"role": "user", "content": "b"}], "k2", if_version=created.version)

    def sync_appends() -> None:
        with MemoryClient(memory_url(launcher)) as sync_memory:
            with pytest.raises(VersionConflict):
                sync_memory.append(cid, [{"role": "user", "content": "stale"}], if_version=created.version)
            sync_memory.append(cid, [{"role": "user", "content": "c"}], if_version=created.version + 1)
            with pytest.raises(InvalidRequest):
                sync_memory.append(cid, [{"role": "user", "content": "x"}], if_version=-1)

    await in_thread(sync_appends)
    assert [e["content"] for e in stored(valkey_server, cid)] == ["a", "b", "c"]


async def test_server_errors_come_back_typed(launcher: Launcher, proxy_process: ServiceProcess) -> None:
    cid = new_conversation_id()
    big = [{"role": "user", "content": "x" * env.MAX_CONTENT_CHARS} for _ in range(5)]  # > 1 MiB body
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        with pytest.raises(PayloadTooLarge) as too_large:
            await memory.append(cid, big)
        assert too_large.value.status == 413
        with launcher.turns.bound("smc1.forged.signature") as turn, pytest.raises(Unauthenticated):
            # The turn's capability is forwarded; this proxy cannot verify one.
            await memory.with_turn(turn).read(cid)
        with pytest.raises(TurnNotLive) as over:  # the memory endpoint's own 401, rebuilt by from_wire
            await memory.with_turn(turn).read(cid)
        assert over.value.status == 401 and isinstance(over.value, Unauthenticated)
        proxy_process.stop()
        with pytest.raises(BackendUnavailable) as down:  # the launcher's typed 503, rebuilt by from_wire
            await memory.read(cid)
        assert down.value.status == 503


async def test_an_unreachable_endpoint_is_backend_unavailable() -> None:
    url = closed_port_url()
    with MemoryClient(url) as memory, pytest.raises(BackendUnavailable) as raised:
        memory.read("fine")
    assert url in raised.value.message
    async with AsyncMemoryClient(url) as amemory:
        with pytest.raises(BackendUnavailable):
            await amemory.append_exchange("fine", "u", "a")


async def test_an_endpoint_that_does_not_answer_in_time_is_backend_unavailable() -> None:
    async def accept_and_stay_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await asyncio.sleep(30)

    silent = await asyncio.start_server(accept_and_stay_silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    try:
        async with AsyncMemoryClient(url, timeout=0.2) as amemory:
            with pytest.raises(BackendUnavailable, match="HttpTimeout"):
                await amemory.read("fine")
        with MemoryClient(url, timeout=0.2) as memory, pytest.raises(BackendUnavailable):
            await asyncio.to_thread(memory.read, "fine")
    finally:
        silent.close()


@pytest.mark.parametrize("turn", ["smt1.a\r\nx-sessionmem-agent: other", "smt1.caf\u00e9"])
def test_a_turn_handle_that_is_not_a_plain_header_value_is_refused(turn: str) -> None:
    # Refused before anything is sent: nothing listens on this port, a request would be BackendUnavailable.
    with MemoryClient(closed_port_url(), turn=turn) as memory, pytest.raises(InvalidRequest):
        memory.read("fine")


# --- checked before the network ---


def _per_conversation_calls(memory: MemoryClient) -> list[Callable[[str], object]]:
    entry = [{"role": "user", "content": "x"}]
    return [
        lambda cid: memory.read(cid),
        lambda cid: memory.append(cid, entry),
        lambda cid: memory.append_exchange(cid, "u", "a"),
        lambda cid: memory.replace(cid, entry, if_version=1),
        lambda cid: memory.delete(cid),
        lambda cid: memory.search(cid, "x"),
        lambda cid: memory.info(cid),
        lambda cid: memory.export(cid),
    ]


def _async_per_conversation_calls(memory: AsyncMemoryClient) -> list[Callable[[str], Any]]:
    entry = [{"role": "user", "content": "x"}]
    return [
        lambda cid: memory.read(cid),
        lambda cid: memory.append(cid, entry),
        lambda cid: memory.append_exchange(cid, "u", "a"),
        lambda cid: memory.replace(cid, entry),
        lambda cid: memory.delete(cid),
        lambda cid: memory.search(cid, "x"),
        lambda cid: memory.info(cid),
        lambda cid: memory.export(cid),
    ]


@pytest.mark.parametrize("bad_id", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_a_bad_id_raises_before_any_network_call(bad_id: str) -> None:
    # Nothing listens on this port: a request would be BackendUnavailable, never InvalidConversationId.
    with MemoryClient(closed_port_url()) as memory:
        with pytest.raises(BackendUnavailable):
            memory.read("a-valid-id")
        for call in _per_conversation_calls(memory):
            with pytest.raises(InvalidConversationId):
                call(bad_id)

    # And, to the letter: the transport is never even asked.
    requests: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(500)

    with MemoryClient("http://memory.test", transport=httpx.MockTransport(record)) as memory:
        for call in _per_conversation_calls(memory):
            with pytest.raises(InvalidConversationId):
                call(bad_id)
    assert requests == []


@pytest.mark.parametrize("bad_id", ["", "a/b", "a:b", "a b", ".."])
async def test_a_bad_id_raises_before_any_network_call_async(bad_id: str) -> None:
    async with AsyncMemoryClient(closed_port_url()) as memory:
        with pytest.raises(BackendUnavailable):
            await memory.read("a-valid-id")
        for call in _async_per_conversation_calls(memory):
            with pytest.raises(InvalidConversationId):
                await call(bad_id)


def test_entries_and_arguments_are_checked_before_the_network() -> None:
    with MemoryClient(closed_port_url()) as memory:
        with pytest.raises(InvalidRequest, match="role"):
            memory.append("c", [{"role": "to ol", "content": "scratch"}])
        with pytest.raises(InvalidRequest):
            memory.append("c", [{"content": "no role"}])
        with pytest.raises(InvalidRequest):
            memory.append("c", [{"role": "user", "content": "x", "unexpected": 1}])
        with pytest.raises(InvalidMessageId):
            memory.append("c", [{"role": "user", "content": "x", "id": "bad:id"}])
        with pytest.raises(InvalidMessageId):
            memory.append_exchange("c", "u", "a", turn_id="bad/turn")
        with pytest.raises(InvalidMessageId):
            memory.append_exchange("c", "u", "a", turn_id="t" * 127)  # "<turn>-u" would be 129 characters
        with pytest.raises(InvalidRequest, match="entries"):
            memory.append("c", [])
        with pytest.raises(InvalidRequest, match="entries"):
            memory.append("c", [{"role": "user", "content": str(i)} for i in range(env.MAX_ENTRIES_PER_APPEND + 1)])
        with pytest.raises(InvalidRequest):
            memory.append("c", [{"role": "user", "content": "x" * (env.MAX_CONTENT_CHARS + 1)}])
        single_entry: Any = {"role": "user", "content": "x"}
        with pytest.raises(InvalidRequest, match="single entry"):
            memory.append("c", single_entry)
        with pytest.raises(InvalidRequest):
            memory.append("c", ["just text"])  # type: ignore[list-item]
        with pytest.raises(InvalidRequest, match="entries"):
            memory.replace("c", [])
        with pytest.raises(InvalidRequest):
            memory.replace("c", [{"role": "user", "content": "x"}], if_version=-1)
        with pytest.raises(InvalidRequest, match="limit"):
            memory.read("c", limit=env.MAX_READ_LIMIT + 1)
        with pytest.raises(InvalidRequest, match="limit"):
            memory.read("c", limit=-1)
        with pytest.raises(InvalidRequest, match="query"):
            memory.search("c", "")
        with pytest.raises(InvalidRequest, match="limit"):
            memory.search("c", "x", limit=0)
        with pytest.raises(InvalidRequest, match="limit"):
            memory.list_conversations(limit=0)


# --- what goes on the wire ---


def test_requests_carry_the_turn_trace_context_and_if_match() -> None:
    seen: list[httpx.Request] = []
    answers = {
        "PUT": {"version": 8, "stored": 1, "scope": "session"},
        "GET": {"conversationId": "a?b", "scope": "session", "version": 7, "entries": []},
    }

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=answers[request.method])

    transport = httpx.MockTransport(answer)
    with MemoryClient(
        "http://memory.test/", turn="smt1.handle", traceparent=TRACEPARENT, transport=transport
    ) as memory:
        assert memory.read("a?b", limit=3, summary=True).version == 7
        assert memory.replace("a?b", [{"role": "user", "content": "x"}], if_version=7).version == 8
        other = f"00-{'1' * 32}-{'2' * 16}-01"
        memory.with_turn(None).read("a?b", traceparent=other)
    read, replace, anonymous = seen
    assert read.url.raw_path == b"/v1/conversations/a%3Fb/entries?limit=3&summary=true"
    assert read.headers[api.TURN_HEADER] == "smt1.handle" and api.USER_CAPABILITY_HEADER not in read.headers
    assert read.headers["traceparent"] == TRACEPARENT
    assert "if-match" not in read.headers and "authorization" not in read.headers
    assert replace.url.raw_path == b"/v1/conversations/a%3Fb"
    assert replace.headers["if-match"] == "7" and replace.headers["content-type"] == "application/json"
    assert orjson.loads(replace.content) == {"entries": [{"role": "user", "content": "x"}]}
    assert api.TURN_HEADER not in anonymous.headers
    assert anonymous.headers["traceparent"] == other, "a per-call traceparent wins"


def test_unexpected_answers_are_typed_errors() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(502, text="<html>bad gateway</html>")
        return httpx.Response(200, json={"not": "a history"})

    with MemoryClient("http://memory.test", transport=httpx.MockTransport(answer)) as memory:
        with pytest.raises(SessionMemError, match="unexpected answer") as bad_shape:
            memory.read("c")
        assert type(bad_shape.value) is SessionMemError and bad_shape.value.status == 200
        with pytest.raises(SessionMemError) as gateway:
            memory.delete("c")
        assert type(gateway.value) is SessionMemError and gateway.value.status == 502
        assert "bad gateway" in gateway.value.message


def test_the_adapters_window_read_checks_the_fields_it_keeps() -> None:
    entry = {"id": "m1", "v": 1, "role": "user", "content": "hi", "author": "a/b", "ts": 1}
    answers = iter(
        [
            {"conversationId": "c", "scope": "session", "version": 1, "entries": [entry], "summary": None},
            {"not": "a history"},
            {"conversationId": "c", "scope": "session", "version": 1, "entries": [{**entry, "role": "tool"}]},
            {"conversationId": "c", "scope": "session", "version": 1, "entries": [{**entry, "content": 7}]},
        ]
    )

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=next(answers))

    with MemoryClient("http://memory.test", transport=httpx.MockTransport(answer)) as memory:
        assert memory._read_window("c", 40, False) == [entry]
        for _ in range(3):
            with pytest.raises(SessionMemError, match="unexpected answer") as bad:
                memory._read_window("c", 40, False)
            assert type(bad.value) is SessionMemError and bad.value.status == 200


def test_the_adapters_append_checks_only_the_status() -> None:
    seen: list[httpx.Request] = []
    answers = iter(
        [
            httpx.Response(200, json={"version": 3, "stored": 1, "duplicate": False, "scope": "session", "length": 3}),
            httpx.Response(200, text="not even json: nothing of it is used"),
            httpx.Response(400, json={"error": {"type": "invalid_request", "message": "content too long"}}),
            httpx.Response(302, text=""),
        ]
    )

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return next(answers)

    entries: list[EntryFields] = [{"role": "user", "content": "hi", "id": "m1"}]
    with MemoryClient("http://memory.test", transport=httpx.MockTransport(answer)) as memory:
        memory._append_batch("a?b", entries)
        memory._append_batch("a?b", entries)
        with pytest.raises(InvalidRequest, match="content too long"):
            memory._append_batch("a?b", entries)
        with pytest.raises(SessionMemError, match="unexpected answer") as redirect:
            memory._append_batch("a?b", entries)
        assert type(redirect.value) is SessionMemError and redirect.value.status == 302
        with pytest.raises(InvalidConversationId):
            memory._append_batch("a/b", entries)
    assert len(seen) == 4, "a bad id is refused before the network"
    assert seen[0].method == "POST" and seen[0].url.raw_path == b"/v1/conversations/a%3Fb/entries"
    assert seen[0].headers["content-type"] == "application/json"
    assert wire.AppendRequest.model_validate_json(seen[0].content) == wire.AppendRequest(
        entries=[wire.EntryIn(role=Role.USER, content="hi", id="m1")]
    ), "the body is the append request the server's model reads"


def test_the_default_base_url_is_the_launcher_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env.LAUNCHER_PORT, raising=False)
    assert default_base_url() == "http://127.0.0.1:2998"
    assert MemoryClient().base_url == "http://127.0.0.1:2998"
    monkeypatch.setenv(env.LAUNCHER_PORT, "3100")
    assert AsyncMemoryClient().base_url == "http://127.0.0.1:3100"
    assert default_base_url({env.LAUNCHER_PORT: ""}) == "http://127.0.0.1:2998"
    with pytest.raises(ValueError, match=env.LAUNCHER_PORT):
        default_base_url({env.LAUNCHER_PORT: "not-a-port"})


async def test_trace_context_reaches_the_launchers_spans(
    launcher: Launcher, span_exporter: InMemorySpanExporter
) -> None:
    cid = new_conversation_id()
    async with AsyncMemoryClient(memory_url(launcher), traceparent=TRACEPARENT) as memory:
        await memory.append_exchange(cid, "u", "a")
    spans = span_exporter.get_finished_spans()
    assert [s.name for s in spans] == ["memory.append"]
    assert spans[0].context is not None and format(spans[0].context.trace_id, "032x") == TRACE_ID
    assert spans[0].parent is not None and format(spans[0].parent.span_id, "016x") == "00f067aa0ba902b7"

    # Without an explicit traceparent the active OpenTelemetry span is propagated.
    span_exporter.clear()
    tracer = TracerProvider().get_tracer("agent")
    with tracer.start_as_current_span("agent-turn") as current:
        async with AsyncMemoryClient(memory_url(launcher)) as memory:
            await memory.read(cid)

        def sync_search() -> None:
            with MemoryClient(memory_url(launcher)) as sync_memory:
                sync_memory.search(cid, "u")

        await in_thread(sync_search)
    trace_id = current.get_span_context().trace_id
    spans = span_exporter.get_finished_spans()
    assert [s.name for s in spans] == ["memory.get", "memory.search"]
    assert all(s.context is not None and s.context.trace_id == trace_id for s in spans)


async def test_one_client_sends_each_calls_own_trace_context(
    launcher: Launcher, span_exporter: InMemorySpanExporter
) -> None:
    # The lean transport keeps encoded headers between calls: a kept set must never carry another
    # call's span, nor a span into a call made outside any.
    cid = new_conversation_id()
    tracer = TracerProvider().get_tracer("agent")
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        turn_ids = []
        for _ in range(2):
            with tracer.start_as_current_span("agent-turn") as current:
                await memory.read(cid)
                await memory.read(cid)
            turn_ids.append(current.get_span_context().trace_id)
        await memory.read(cid)
    spans = span_exporter.get_finished_spans()
    trace_ids = [s.context.trace_id for s in spans if s.context is not None]
    assert len(trace_ids) == 5 and turn_ids[0] != turn_ids[1]
    assert trace_ids[:4] == [turn_ids[0], turn_ids[0], turn_ids[1], turn_ids[1]]
    assert trace_ids[4] not in turn_ids, "a call outside any span starts its own trace"
