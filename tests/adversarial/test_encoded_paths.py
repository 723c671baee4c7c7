"""Escaped separators in the request target against the real proxy process.

granian's RSGI interface hands the app the percent-decoded path and nothing else of the request target
(docs/limits.md, "Paths are matched decoded"), so ``x%2Fentries`` cannot be told from ``x/entries``. What
holds instead, and is checked here on raw sockets: an escaped ``/`` that leaves a ``/`` inside an id is a
typed 400 and stores nothing; one that spells a route's own separators is served as that decoded route, for
the same verified caller and its own conversation only, as if it had sent the plain path: a stranger is
refused before any body is read, and another agent never sees what was stored that way.
"""

from __future__ import annotations

import orjson

from sessionmem_core import api
from sessionmem_core.devauth import dev_token
from tests.adversarial.rawhttp import Answer, connect, read_answer, request
from tests.support.processes import ServiceProcess

OTHER_TOKEN = dev_token("team-b", "other-agent")


def _send(port: int, raw: bytes) -> Answer:
    with connect(port) as sock:
        sock.sendall(raw)
        return read_answer(sock.makefile("rb"))


def _append(content: str) -> bytes:
    return orjson.dumps({"entries": [{"role": "user", "content": content}]})


def _contents(answer: Answer) -> list[str]:
    document = answer.json()
    assert isinstance(document, dict), document
    return [entry["content"] for entry in document["entries"]]


def test_an_escaped_slash_inside_an_id_is_a_typed_400_and_stores_nothing(proxy: ServiceProcess) -> None:
    for method, target, body in (
        ("GET", "/v1/conversations/a%2Fb/entries", None),
        ("GET", "/v1/conversations/a%2fb", None),
        ("POST", "/v1/conversations/a%2Fb/entries", _append("never stored")),
        ("GET", "/v1/conversations/x%2Fentries%2Fentries", None),
    ):
        answer = _send(proxy.port, request(method, target, body))
        assert answer.status == 400 and answer.error_type == "invalid_conversation_id", (method, target, answer)
    for conversation in ("a", "b", "a/b"):
        stored = _send(proxy.port, request("GET", api.entries_path(conversation)))
        assert stored.status in (200, 400), stored
        assert stored.status == 400 or _contents(stored) == [], (conversation, stored)


def test_escaped_route_separators_reach_only_what_the_plain_path_gives_the_same_caller(
    proxy: ServiceProcess,
) -> None:
    plain = api.entries_path("escaped-x")
    escaped_append = "/v1%2Fconversations%2Fescaped-x%2Fentries"
    body = _append("sent with escaped separators")

    stranger = b"".join(
        (
            f"POST {escaped_append} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode(),
            f"Content-Length: {len(body)}\r\n\r\n".encode(),
            body,
        )
    )
    refused = _send(proxy.port, stranger)
    assert refused.status == 401, refused

    stored = _send(proxy.port, request("POST", escaped_append, body))
    assert stored.status == 200, stored

    read_plain = _send(proxy.port, request("GET", plain))
    read_escaped = _send(proxy.port, request("GET", "/v1/conversations/escaped-x%2Fentries"))
    assert _contents(read_plain) == ["sent with escaped separators"], read_plain
    assert read_escaped.status == 200 and read_escaped.json() == read_plain.json(), read_escaped

    other = _send(
        proxy.port,
        f"GET {escaped_append} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OTHER_TOKEN}\r\n\r\n".encode(),
    )
    assert other.status == 200 and _contents(other) == [], "another agent saw the entry stored via escapes"
