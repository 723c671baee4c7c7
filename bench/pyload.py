"""A closed-loop HTTP/1.1 keep-alive load generator on asyncio protocols (uvloop), for machines without wrk.

Run as its own process (``python -m bench.pyload '<json spec>'``) so it does not share an interpreter with
anything it measures; prints one JSON result line. Each connection sends its next request as soon as the
previous answer is complete (no pipelining). Requests are pre-encoded; answers are parsed only as far as
the status line and Content-Length (the servers measured here always send one).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


@dataclass
class _State:
    requests: list[bytes]
    measure_from: int
    measure_until: int
    latencies_ns: list[int] = field(default_factory=list)
    errors: int = 0
    next_index: int = 0
    stopping: bool = False

    def next_request(self) -> bytes:
        request = self.requests[self.next_index]
        self.next_index = (self.next_index + 1) % len(self.requests)
        return request


class _Connection(asyncio.Protocol):
    def __init__(self, state: _State, done: asyncio.Future[None]) -> None:
        self._state = state
        self._done = done
        self._buffer = bytearray()
        self._sent_at = 0
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._send()

    def _send(self) -> None:
        assert self._transport is not None
        self._sent_at = time.perf_counter_ns()
        self._transport.write(self._state.next_request())

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        match = _CONTENT_LENGTH.search(self._buffer, 0, end + 2)
        length = int(match.group(1)) if match else 0
        if len(self._buffer) < end + 4 + length:
            return
        status = int(self._buffer[9:12])
        del self._buffer[: end + 4 + length]
        now = time.perf_counter_ns()
        state = self._state
        if state.measure_from <= self._sent_at and now <= state.measure_until:
            state.latencies_ns.append(now - self._sent_at)
            if not 200 <= status < 400:
                state.errors += 1
        if now >= state.measure_until:
            assert self._transport is not None
            self._transport.close()
            return
        self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._state.errors += 1
        if not self._done.done():
            self._done.set_result(None)


def _factory(state: _State, done: asyncio.Future[None]) -> Callable[[], _Connection]:
    return lambda: _Connection(state, done)


def _percentile(sorted_ns: list[int], q: float) -> float:
    if not sorted_ns:
        return 0.0
    index = min(len(sorted_ns) - 1, max(0, round(q / 100.0 * len(sorted_ns)) - 1))
    return sorted_ns[index] / 1e6


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    host = "127.0.0.1"
    port = int(spec["port"])
    headers = "".join(f"{k}: {v}\r\n" for k, v in spec["headers"])
    body = spec["body"].encode()
    length = f"content-length: {len(body)}\r\n" if body or spec["method"] in ("POST", "PUT") else ""
    requests = [
        f"{spec['method']} {path} HTTP/1.1\r\nhost: {host}:{port}\r\n{headers}{length}\r\n".encode() + body
        for path in spec["paths"]
    ]
    start = time.perf_counter_ns()
    warmup_ns = int(float(spec["warmup"]) * 1e9)
    duration_ns = int(float(spec["duration"]) * 1e9)
    state = _State(requests=requests, measure_from=start + warmup_ns, measure_until=start + warmup_ns + duration_ns)
    loop = asyncio.get_running_loop()
    finished: list[asyncio.Future[None]] = []
    for _ in range(int(spec["connections"])):
        done: asyncio.Future[None] = loop.create_future()
        await loop.create_connection(_factory(state, done), host, port)
        finished.append(done)
    await asyncio.wait_for(asyncio.gather(*finished), timeout=(warmup_ns + duration_ns) / 1e9 + 30)
    latencies = sorted(state.latencies_ns)
    seconds = duration_ns / 1e9
    return {
        "requests": len(latencies),
        "seconds": seconds,
        "errors": state.errors,
        "p50_ms": _percentile(latencies, 50),
        "p90_ms": _percentile(latencies, 90),
        "p99_ms": _percentile(latencies, 99),
        "mean_ms": (sum(latencies) / len(latencies) / 1e6) if latencies else 0.0,
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        import uvloop

        result = uvloop.run(run(spec))
    except ImportError:
        result = asyncio.run(run(spec))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
