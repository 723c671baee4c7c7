"""Requests pipelined on one connection are answered, and appends stored, in the order they were sent."""

from __future__ import annotations

import contextlib
import time

import httpx
import orjson

from tests.adversarial.conftest import HEAD_TIMEOUT_SECONDS
from tests.adversarial.rawhttp import OWNER, TOKEN, connect, memory_kib, read_answer, request, worker_pid
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess


def test_a_read_and_a_health_check_pipelined_are_answered_in_order(proxy: ServiceProcess) -> None:
    with connect(proxy.port) as sock:
        sock.sendall(request("GET", "/v1/conversations/piped-read/entries?limit=500") + request("GET", "/healthz"))
        stream = sock.makefile("rb")
        first, second = read_answer(stream), read_answer(stream)
    assert first.status == 200 and first.json() == {
        "conversationId": "piped-read",
        "scope": "session",
        "version": 0,
        "entries": [],
    }
    assert second.status == 200 and second.json() == {"status": "ok"}


def test_pipelined_appends_are_stored_and_answered_in_order(proxy: ServiceProcess, valkey: ValkeyProcess) -> None:
    count = 40
    batch = b"".join(
        request(
            "POST",
            "/v1/conversations/piped-appends/entries",
            body=orjson.dumps({"entries": [{"role": "user", "content": f"turn {i}", "id": f"m{i}"}]}),
        )
        for i in range(count)
    )
    with connect(proxy.port) as sock:
        sock.sendall(batch + request("GET", "/v1/conversations/piped-appends/entries?limit=500"))
        stream = sock.makefile("rb")
        answers = [read_answer(stream) for _ in range(count + 1)]
    versions = [orjson.loads(a.body)["version"] for a in answers[:count]]
    assert versions == list(range(1, count + 1)), "answers come back in the order the appends were sent"
    history = answers[-1].json()
    assert isinstance(history, dict)
    assert [e["content"] for e in history["entries"]] == [f"turn {i}" for i in range(count)]
    stored = valkey.client().lrange(f"mem:{OWNER.namespace}/{OWNER.agent}:piped-appends", 0, -1)
    assert [orjson.loads(raw)["id"] for raw in stored] == [f"m{i}" for i in range(count)]


def test_answers_to_pipelined_requests_nobody_reads_do_not_pile_up(proxy: ServiceProcess) -> None:
    """200 pipelined reads of a 2.5 MiB window (500 MiB of answers) from a client that reads nothing:
    the server writes one answer at a time, so the worker holds about one, not all of them."""
    content = "y" * (64 * 1024)
    with httpx.Client(base_url=proxy.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as client:
        for _ in range(10):
            entries = [{"role": "user", "content": content} for _ in range(4)]
            assert client.post("/v1/conversations/piped-big/entries", json={"entries": entries}).status_code == 200
    worker = worker_pid(proxy.pid)
    before = memory_kib(worker, "VmHWM")
    one = request("GET", "/v1/conversations/piped-big/entries?limit=40")
    with connect(proxy.port) as sock:
        sock.settimeout(2)
        with contextlib.suppress(TimeoutError):  # the server stops reading once its answers back up
            sock.sendall(one * 200)
        time.sleep(HEAD_TIMEOUT_SECONDS)  # the client reads nothing meanwhile
        growth = memory_kib(worker, "VmHWM") - before
    assert growth < 32 * 1024, f"worker peak memory grew {growth} KiB under unread pipelined answers"
