"""Hostile clients against the real proxy process: every serving limit answers with its typed status (or
closes the connection) in bounded time and memory, while other clients are still served."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time

import httpx

from sessionmem_core import env
from tests.adversarial.conftest import BODY_TIMEOUT_SECONDS, HEAD_TIMEOUT_SECONDS, MAX_IN_FLIGHT
from tests.adversarial.rawhttp import (
    closed_within,
    connect,
    memory_kib,
    read_answer,
    request,
    worker_pid,
)
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess

# Slack for scheduling on a loaded machine: a timeout must fire, not fire to the millisecond.
SLACK_SECONDS = 3.0
FLOOD_BYTES = 32 * 1024 * 1024


def _healthy(proxy: ServiceProcess) -> bool:
    return httpx.get(proxy.health_url, timeout=5).status_code == 200


def test_a_header_flood_is_refused_without_growing_the_worker(proxy: ServiceProcess) -> None:
    worker = worker_pid(proxy.pid)
    assert _healthy(proxy)
    before = memory_kib(worker)
    sent = 0
    with connect(proxy.port) as sock:
        sock.sendall(b"GET /v1/conversations/flood/entries HTTP/1.1\r\nHost: x\r\n")
        line = b"X-Flood: " + b"a" * 8183 + b"\r\n"
        try:
            while sent < FLOOD_BYTES:
                sock.sendall(line)
                sent += len(line)
        except OSError:
            pass  # the server stopped reading and closed: what a flood should get
        stream = sock.makefile("rb")
        try:
            answer = read_answer(stream)
        except (ConnectionError, OSError):
            answer = None
    assert answer is None or answer.status == 431, answer
    assert sent < FLOOD_BYTES, "the server kept reading a 32 MiB head"
    growth_kib = memory_kib(worker) - before
    assert growth_kib < 16 * 1024, f"worker RSS grew {growth_kib} KiB"
    assert _healthy(proxy)


def test_too_many_header_fields_is_a_typed_431(proxy: ServiceProcess) -> None:
    headers = {f"X-Field-{i}": "x" for i in range(env.DEFAULT_MAX_HEADER_COUNT)}
    with connect(proxy.port) as sock:
        sock.sendall(request("GET", "/v1/conversations/c/entries", headers=headers))
        answer = read_answer(sock.makefile("rb"))
    assert answer.status == 431 and answer.error_type == "headers_too_large"


def test_slowloris_and_idle_connections_are_closed_while_others_are_served(proxy: ServiceProcess) -> None:
    trickling = connect(proxy.port)
    idle = connect(proxy.port)
    idle.sendall(request("GET", "/healthz"))
    assert read_answer(idle.makefile("rb")).status == 200
    stop = threading.Event()

    def trickle() -> None:
        try:
            trickling.sendall(b"GET /v1/conversations/slow/entries HTTP/1.1\r\n")
            while not stop.wait(0.2):
                trickling.sendall(b"X: y\r\n")
        except OSError:
            pass

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        served = httpx.get(proxy.health_url, timeout=5)
        assert served.status_code == 200, "another client is served while the slow ones hang on"
        limit = HEAD_TIMEOUT_SECONDS + SLACK_SECONDS
        slow_closed = closed_within(trickling, limit)
        idle_closed = closed_within(idle, limit)
    finally:
        stop.set()
        thread.join(5)
        trickling.close()
        idle.close()
    assert slow_closed is not None, f"a trickled head was still open after {limit} s"
    assert idle_closed is not None, f"an idle keep-alive connection was still open after {limit} s"
    assert _healthy(proxy)


def test_a_url_over_the_limit_is_a_typed_414(proxy: ServiceProcess) -> None:
    target = "/v1/conversations/c/entries?q=" + "x" * env.DEFAULT_MAX_URL_BYTES
    with connect(proxy.port) as sock:
        sock.sendall(request("GET", target))
        answer = read_answer(sock.makefile("rb"))
    assert answer.status == 414 and answer.error_type == "uri_too_long"


def test_a_url_past_the_head_buffer_gets_hypers_bare_431_and_one_inside_it_a_typed_414(
    proxy: ServiceProcess,
) -> None:
    """The one answer that is not typed JSON (README, docs/limits.md): a head that does not fit hyper's read
    buffer is refused by hyper before the app sees the request, with an empty 431, and the connection is
    closed. A URL over the app's limit that still fits the buffer gets the app's typed 414."""
    buffer = env.DEFAULT_MAX_HEADER_BYTES
    inside = "/v1/conversations/c/entries?q=" + "x" * (buffer - 2048)
    with connect(proxy.port) as sock:
        sock.sendall(request("GET", inside))
        typed = read_answer(sock.makefile("rb"))
    assert typed.status == 414 and typed.error_type == "uri_too_long", typed

    past = "/v1/conversations/c/entries?q=" + "x" * (100 * 1024)
    with connect(proxy.port) as sock:
        sock.sendall(request("GET", past))
        stream = sock.makefile("rb")
        bare = read_answer(stream)
        assert bare.status == 431 and bare.body == b"", bare
        assert "application/json" not in bare.headers.get("content-type", ""), bare
        assert closed_within(sock, SLACK_SECONDS) is not None, "the connection stayed open"
    assert _healthy(proxy)


def test_a_body_over_the_limit_is_a_typed_413_declared_or_streamed(proxy: ServiceProcess) -> None:
    # An agent's own request (a stranger's would be refused before its length is looked at).
    declared = request("POST", "/v1/conversations/big/entries", headers={"Content-Length": str(env.MAX_BODY_BYTES + 1)})
    with connect(proxy.port) as sock:
        sock.sendall(declared)  # and never the body: answered by the body timeout at the latest
        started = time.monotonic()
        answer = read_answer(sock.makefile("rb"))
        waited = time.monotonic() - started
    assert answer.status == 413 and answer.error_type == "payload_too_large"
    assert waited < BODY_TIMEOUT_SECONDS + SLACK_SECONDS

    chunk = b"a" * 65536
    with connect(proxy.port) as sock:
        sock.sendall(request("POST", "/v1/conversations/big/entries", headers={"Transfer-Encoding": "chunked"}))
        try:
            for _ in range(env.MAX_BODY_BYTES // len(chunk) + 8):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass
        answer = read_answer(sock.makefile("rb"))
    assert answer.status == 413 and answer.error_type == "payload_too_large"


def test_a_body_that_does_not_arrive_in_time_is_a_typed_408(proxy: ServiceProcess) -> None:
    with connect(proxy.port) as sock:
        sock.sendall(request("POST", "/v1/conversations/late/entries", body=b'{"entries":')[:-1])
        started = time.monotonic()
        answer = read_answer(sock.makefile("rb"))
        waited = time.monotonic() - started
    assert answer.status == 408 and answer.error_type == "request_timeout"
    assert waited < BODY_TIMEOUT_SECONDS + SLACK_SECONDS


def test_a_body_trickled_byte_by_byte_is_cut_off_at_the_body_timeout(proxy: ServiceProcess) -> None:
    """Every byte arrives well within any per-read timeout, but the whole body does not arrive in time."""
    body = b'{"entries":[{"role":"user","content":"' + b"x" * 200 + b'"}]}'
    with connect(proxy.port) as sock:
        sock.sendall(request("POST", "/v1/conversations/trickle/entries", body=body)[: -len(body)])
        started = time.monotonic()
        sent = 0
        with contextlib.suppress(OSError):
            for byte in body:
                sock.sendall(bytes([byte]))
                sent += 1
                readable, _, _ = select.select([sock], [], [], 0.1)
                if readable:
                    break
        answer = read_answer(sock.makefile("rb"))
        waited = time.monotonic() - started
    assert answer.status == 408 and answer.error_type == "request_timeout"
    assert sent < len(body) and waited < BODY_TIMEOUT_SECONDS + SLACK_SECONDS


def test_requests_over_the_worker_limit_are_a_typed_503_then_served_again(
    proxy: ServiceProcess, valkey: ValkeyProcess
) -> None:
    # Valkey paused: every read admitted waits on it, in its slot. One more read than the worker takes,
    # and nothing else running, so exactly one of them must be refused at once.
    holders: list[socket.socket] = []
    pause_ms = 1500
    try:
        valkey.client().execute_command("CLIENT", "PAUSE", str(pause_ms), "ALL")
        for i in range(MAX_IN_FLIGHT + 1):
            sock = connect(proxy.port)
            sock.sendall(request("GET", f"/v1/conversations/hold{i}/entries"))
            holders.append(sock)
            time.sleep(0.05)
        assert _healthy(proxy), "liveness is answered even when the worker is full"
        answers = [read_answer(sock.makefile("rb")) for sock in holders]
    finally:
        for sock in holders:
            sock.close()
    refused = [a for a in answers if a.status == 503 and a.error_type == "overloaded"]
    assert len(refused) == 1, [(a.status, a.body) for a in answers]
    assert _healthy(proxy)
    with connect(proxy.port) as sock:
        sock.sendall(request("GET", "/v1/conversations/c/entries"))
        assert read_answer(sock.makefile("rb")).status == 200, "served again once the slots are free"


def test_a_malformed_chunked_body_is_a_typed_400_and_an_abandoned_upload_costs_nothing(
    proxy: ServiceProcess,
) -> None:
    """Broken body framing is the client's fault (400, typed), never the server's (500); a client that
    leaves halfway through its body leaves the server serving."""
    head = request("POST", "/v1/conversations/chunks/entries", headers={"Transfer-Encoding": "chunked"})
    with connect(proxy.port) as sock:
        sock.sendall(head + b"ZZ\r\nabc\r\n0\r\n\r\n")
        answer = read_answer(sock.makefile("rb"))
    assert answer.status == 400 and answer.error_type == "invalid_request", answer
    for _ in range(20):
        with connect(proxy.port) as sock:
            sock.sendall(request("POST", "/v1/conversations/left/entries", b'{"entries":[')[:-4])
    assert _healthy(proxy)
