"""Requests pipelined on one connection are answered, and appends stored, in the order they were sent."""

from __future__ import annotations

import orjson

from tests.adversarial.rawhttp import OWNER, connect, read_answer, request
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
