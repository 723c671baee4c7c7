"""Strangers and ambiguous requests against the real proxy process: a client without credentials never
holds one of the worker's slots nor gets its body read, and a head that could be read two ways (a repeated
identity or conversation field, no Host, stacked transfer codings, a path that climbs) is a typed 400 that
closes the connection, never served under one of its readings."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import orjson

from tests.adversarial.conftest import BODY_TIMEOUT_SECONDS, MAX_IN_FLIGHT
from tests.adversarial.rawhttp import TOKEN, Answer, closed_within, connect, read_answer, request
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _raw(port: int, head: str, body: bytes = b"") -> Answer:
    with connect(port) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + body)
        return read_answer(sock.makefile("rb"))


def _stranger_head(conversation: str, length: int, extra: str = "") -> bytes:
    return (
        f"POST /v1/conversations/{conversation}/entries HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n"
    ).encode()


def test_strangers_holding_back_bodies_leave_other_agents_served(proxy: ServiceProcess) -> None:
    """Heads without credentials that promise a body and never send it, reopened as soon as they end:
    more of them at once than the worker has slots. An agent's reads are all served meanwhile."""
    stop = threading.Event()
    opened = [0]

    def hold() -> None:
        held: list[socket.socket] = []
        while not stop.is_set():
            try:
                sock = connect(proxy.port, timeout=2)
                sock.sendall(_stranger_head("held", 100))
                held.append(sock)
                opened[0] += 1
            except OSError:
                pass
            if len(held) >= MAX_IN_FLIGHT + 2:
                held.pop(0).close()
            stop.wait(0.01)
        for sock in held:
            sock.close()

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    statuses: list[int] = []
    try:
        time.sleep(0.3)
        with httpx.Client(base_url=proxy.base_url, headers=AUTH, timeout=5) as client:
            for _ in range(30):
                statuses.append(client.get("/v1/conversations/bystander/entries").status_code)
                time.sleep(0.02)
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    assert opened[0] > 2 * MAX_IN_FLIGHT, "the strangers kept opening requests"
    assert statuses == [200] * len(statuses), statuses


def test_a_strangers_body_is_never_read(proxy: ServiceProcess) -> None:
    """Without credentials the answer is a 401 at once, before the body (which never comes) would be
    waited for, and the connection is closed: nothing of what a stranger sends is read or parsed."""
    with connect(proxy.port) as sock:
        sock.sendall(_stranger_head("stranger", 1 << 20))
        started = time.monotonic()
        answer = read_answer(sock.makefile("rb"))
        waited = time.monotonic() - started
        closed = closed_within(sock, 2.0)
    assert answer.status == 401 and answer.error_type == "unauthenticated", answer
    assert waited < BODY_TIMEOUT_SECONDS / 2, f"answered after {waited:.2f} s: the body was waited for"
    assert closed is not None, "the connection with the unread body stayed open"


def test_expect_continue_is_answered_only_after_authentication_and_the_size_check(proxy: ServiceProcess) -> None:
    expect = "Expect: 100-continue\r\n"
    with connect(proxy.port) as sock:
        sock.sendall(_stranger_head("expecting", 64, expect))
        stranger = read_answer(sock.makefile("rb"))
    assert stranger.status == 401, "a stranger is refused before it is told to send its body"
    with connect(proxy.port) as sock:
        sock.sendall(_stranger_head("expecting", 1 << 30, f"Authorization: Bearer {TOKEN}\r\n{expect}"))
        oversized = read_answer(sock.makefile("rb"))
    assert oversized.status == 413 and oversized.error_type == "payload_too_large", oversized
    body = orjson.dumps({"entries": [{"role": "user", "content": "hi"}]})
    with connect(proxy.port) as sock:
        sock.sendall(_stranger_head("expecting", len(body), f"Authorization: Bearer {TOKEN}\r\n{expect}"))
        stream = sock.makefile("rb")
        told = read_answer(stream)
        sock.sendall(body)
        stored = read_answer(stream)
    assert told.status == 100 and stored.status == 200, (told, stored)


def test_a_repeated_identity_or_conversation_field_is_a_typed_400(proxy: ServiceProcess) -> None:
    for field in ("Authorization: Bearer dev:team-b/other-agent", "X-Sessionmem-User-Capability: a"):
        answer = _raw(
            proxy.port,
            f"GET /v1/conversations/twice/entries HTTP/1.1\nHost: x\nAuthorization: Bearer {TOKEN}\n{field}\n"
            + ("X-Sessionmem-User-Capability: b\n" if "Capability" in field else "")
            + "\n",
        )
        assert answer.status == 400 and answer.error_type == "malformed_request", (field, answer)
        assert answer.headers.get("connection") == "close"


def test_a_path_that_climbs_is_a_typed_400_however_it_is_spelled(proxy: ServiceProcess) -> None:
    for target in (
        "/v1/conversations/a%2F..%2Fb/entries",
        "/v1/conversations/a/../b/entries",
        "/v1/conversations/%2E%2E/entries",
        "/v1/%2E/conversations/c/entries",
    ):
        answer = _raw(proxy.port, f"GET {target} HTTP/1.1\nHost: x\nAuthorization: Bearer {TOKEN}\n\n")
        assert answer.status == 400 and answer.error_type == "malformed_request", (target, answer)


def test_heads_rfc_9112_refuses_are_typed_400s(proxy: ServiceProcess) -> None:
    path = "/v1/conversations/lenient/entries"
    auth = f"Authorization: Bearer {TOKEN}\n"
    parts = (b'{"entries":[{"role":"user",', b'"content":"framed"}]}')
    chunked_body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"
    cases = {
        "no Host": (f"GET {path} HTTP/1.1\n{auth}\n", b""),
        "two Hosts": (f"GET {path} HTTP/1.1\nHost: x\nHost: y\n{auth}\n", b""),
        "identity, chunked": (f"POST {path} HTTP/1.1\nHost: x\n{auth}Transfer-Encoding: identity, chunked\n\n", b""),
        "chunked twice": (
            f"POST {path} HTTP/1.1\nHost: x\n{auth}Transfer-Encoding: chunked\nTransfer-Encoding: chunked\n\n",
            chunked_body,
        ),
        "gzip, chunked": (f"POST {path} HTTP/1.1\nHost: x\n{auth}Transfer-Encoding: gzip, chunked\n\n", b""),
    }
    for name, (head, body) in cases.items():
        answer = _raw(proxy.port, head, body)
        assert answer.status == 400 and answer.error_type == "malformed_request", (name, answer)
    stored = _raw(proxy.port, f"POST {path} HTTP/1.1\nHost: x\n{auth}Transfer-Encoding: chunked\n\n", chunked_body)
    assert stored.status == 200, "a chunked body sent once and whole is taken"


def test_a_chunked_body_cut_before_its_last_chunk_is_not_stored(proxy: ServiceProcess, valkey: ValkeyProcess) -> None:
    path = "/v1/conversations/cut-short/entries"
    whole = b'{"entries":[{"role":"user","content":"cut"}]}'
    with connect(proxy.port) as sock:
        sock.sendall(request("POST", path, headers={"Transfer-Encoding": "chunked"}))
        sock.sendall(b"%x\r\n%s\r\n" % (len(whole), whole))  # a whole JSON document, and no last chunk
        sock.shutdown(socket.SHUT_WR)
        try:
            answer: Answer | None = read_answer(sock.makefile("rb"))
        except (ConnectionError, OSError):
            answer = None
    assert answer is None or answer.status == 400, answer
    with connect(proxy.port) as sock:
        sock.sendall(request("GET", path))
        read = read_answer(sock.makefile("rb"))
    document = read.json()
    assert isinstance(document, dict) and document["entries"] == [], "the cut body was stored"
