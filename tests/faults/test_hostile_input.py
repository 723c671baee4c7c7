"""Hostile input through the real processes: ids that carry JSON metacharacters, cursors out of range,
methods nobody declared. Each test states the contract (a typed 4xx, or a correct answer), so it holds
whichever fix is chosen. Each of them found a bug that is now fixed: ids with quotes or backslashes
corrupting stored JSON, a managed loop that did not fail open on an unreadable history, an out-of-range
cursor reaching Valkey, and a 405 without Allow."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from sessionmem_core import api
from tests.faults.stack import AOF_ALWAYS, AUTH, Stack, running_stack

HOSTILE_IDS = ['a"b', "a\\b", 'x"', "x\\"]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack(AOF_ALWAYS, with_launcher=True) as running:
        yield running


@pytest.fixture
def proxy(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.proxy.base_url, headers=AUTH, timeout=5) as http:
        yield http


def _typed_4xx(response: httpx.Response) -> bool:
    return 400 <= response.status_code < 500 and "type" in orjson.loads(response.content).get("error", {})


@pytest.mark.parametrize("message_id", HOSTILE_IDS)
def test_hostile_message_id_is_refused_or_stored_safely(proxy: httpx.Client, message_id: str) -> None:
    cid = f"msgid-{HOSTILE_IDS.index(message_id)}"
    first = proxy.post(api.entries_path(cid), json={"entries": [{"role": "user", "content": "one", "id": "m1"}]})
    assert first.status_code == 200
    hostile = proxy.post(api.entries_path(cid), json={"entries": [{"role": "user", "content": "x", "id": message_id}]})
    if hostile.status_code != 200:
        assert _typed_4xx(hostile), hostile.text
    after = proxy.post(api.entries_path(cid), json={"entries": [{"role": "user", "content": "three", "id": "m3"}]})
    assert after.status_code == 200
    # The conversation still reads as JSON, its version never went back, and search still answers.
    read = proxy.get(api.entries_path(cid))
    body = orjson.loads(read.content)
    assert body["version"] == after.json()["version"] == (3 if hostile.status_code == 200 else 2)
    ids = [e["id"] for e in body["entries"]]
    assert ids == (["m1", message_id, "m3"] if hostile.status_code == 200 else ["m1", "m3"])
    assert proxy.get(api.search_path(cid), params={"q": "three"}).status_code == 200


@pytest.mark.parametrize("conversation_id", HOSTILE_IDS)
def test_hostile_conversation_id_is_refused_or_echoed_as_valid_json(proxy: httpx.Client, conversation_id: str) -> None:
    for path in (api.entries_path(conversation_id), api.export_path(conversation_id)):
        response = proxy.get(path.replace("\\", "%5C").replace('"', "%22"))
        if response.status_code != 200:
            assert _typed_4xx(response), response.text
            continue
        assert orjson.loads(response.content)["conversationId"] == conversation_id


def test_managed_loop_fails_open_on_a_conversation_poisoned_through_the_memory_endpoint(stack: Stack) -> None:
    """An agent (or a tool it runs) appends through its localhost memory endpoint with a hostile message id;
    the managed loop must still answer every later turn of that conversation (fail-open), never a 500."""
    assert stack.launcher is not None
    cid = "poisoned-turns"
    with httpx.Client(base_url=f"http://127.0.0.1:{stack.memory_port}", timeout=5) as memory:
        memory.post(api.entries_path(cid), json={"entries": [{"role": "user", "content": "hi", "id": 'p"q'}]})
    with httpx.Client(base_url=stack.launcher.base_url, timeout=10) as loop:
        turn = loop.post("/", json={"input": "hello"}, headers={api.CONVERSATION_ID_HEADER: cid})
    assert turn.status_code == 200, turn.text
    assert turn.headers[api.MEMORY_STATUS_HEADER] in ("ok", "unavailable", "not-stored")


@pytest.mark.parametrize("cursor", ["18446744073709551616", "99999999999999999999"])
def test_listing_cursor_out_of_range_is_a_typed_400(proxy: httpx.Client, cursor: str) -> None:
    response = proxy.get(api.CONVERSATIONS_PATH, params={"cursor": cursor})
    assert response.status_code == 400 and _typed_4xx(response), response.text


def test_undeclared_method_is_405_with_allow(proxy: httpx.Client) -> None:
    response = proxy.request("TRACE", "/healthz")
    assert response.status_code == 405
    assert "GET" in response.headers.get("allow", "")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/conversations/%2e%2e/entries", None),
        ("GET", "/v1/conversations/a%2Fb/entries", None),
        ("GET", "/v1/conversations/a%3Ab/entries", None),
        ("GET", "/v1/conversations/a%0Ab/entries", None),
        ("GET", "/v1/conversations/" + "x" * 129 + "/entries", None),
        ("POST", "/v1/conversations/ok/entries", b'{"entries": [{"role": "no such role!", "content": "x"}]}'),
        ("POST", "/v1/conversations/ok/entries", b'{"entries": []}'),
        ("POST", "/v1/conversations/ok/entries", b"{not json"),
        ("POST", "/v1/conversations/ok/entries", b'{"entries": [{"role": "user", "content": "x", "id": "a:b"}]}'),
        ("PUT", "/v1/conversations/ok", b'{"entries": [{"role": "user", "content": "x"}]}'),
    ],
)
def test_malformed_requests_get_typed_4xx_never_5xx(
    proxy: httpx.Client, method: str, path: str, body: bytes | None
) -> None:
    headers = {"content-type": "application/json", "if-match": "not-a-version"} if body else {}
    response = proxy.request(method, path, content=body, headers=headers)
    assert 400 <= response.status_code < 500 and _typed_4xx(response), (response.status_code, response.text)


def test_oversized_body_is_a_typed_413(proxy: httpx.Client) -> None:
    big = b'{"entries": [{"role": "user", "content": "' + b"x" * (1024 * 1024 + 10) + b'"}]}'
    response = proxy.post(api.entries_path("big"), content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and _typed_4xx(response)
