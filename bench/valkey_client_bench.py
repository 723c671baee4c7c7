"""CPU per command of the proxy's Valkey client: valkey-py's asyncio client against ``RespClient``.

``python -m bench.valkey_client_bench [--loop uvloop|asyncio] [--rounds N] [--ops N]``

The workload is the proxy's, through ``ConversationStore`` on each client: ``read`` (LRANGE key -40 -1 on a
500-entry list of ~270-byte entries) and ``append`` (the append script, one {user, assistant} exchange), with
1 and 64 concurrent tasks. A "bare floor" row (a FIFO of futures on one connection, nothing else) shows what
the event loop, the syscalls and the store cost with next to no client: what is left above it is the client's.
Figures are this process's CPU time (``time.process_time``) per command and
commands per second of wall time. The rounds interleave the clients, and the median of the rounds is printed,
so a neighbour's load on a shared machine weighs on both sides alike.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, cast

import libvalkey
import valkey.asyncio as valkey_async

from bench.data import ASSISTANT_TEXT, CAP, READ_LIMIT, TTL_SECONDS, USER_TEXT
from bench.procs import Valkey
from sessionmem_core.store import ConversationStore, NewEntry
from sessionmem_core.valkey_client import connect

READ_KEY = "mem:bench/client:read"
ENTRIES = CAP  # 500
_MORE: Final = object()
EXCHANGE = [NewEntry(role="user", content=USER_TEXT), NewEntry(role="assistant", content=ASSISTANT_TEXT)]


def valkey_py(url: str) -> Any:
    """The standalone client ``connect()`` made before RespClient, with the same settings."""
    return valkey_async.Valkey.from_url(
        url,
        socket_timeout=2.0,
        socket_connect_timeout=2.0,
        max_connections=256,
        health_check_interval=0,
        decode_responses=False,
    )


class _BareProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = libvalkey.Reader(notEnoughData=_MORE)
        self.pending: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not _MORE:
            self.pending.popleft().set_result(reply)


class Bare:
    """The floor, not a client: one connection, a write per command and a FIFO of futures, no timeouts,
    errors or reconnects. What the loop, the syscalls and the store cost with next to no client at all."""

    def __init__(self, url: str) -> None:
        self.port = int(url.rsplit(":", 1)[1].split("/")[0])
        self.protocol: _BareProtocol | None = None

    async def _send(self, *args: Any) -> Any:
        if self.protocol is None:
            _, self.protocol = await asyncio.get_running_loop().create_connection(_BareProtocol, port=self.port)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.protocol.pending.append(fut)
        assert self.protocol.transport is not None
        self.protocol.transport.write(libvalkey.pack_command(args))
        return await fut

    def register_script(self, script: str) -> Callable[..., Awaitable[Any]]:
        sha = hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()
        loaded: list[bool] = []

        async def call(keys: list[Any], args: list[Any]) -> Any:
            if not loaded:
                await self._send("SCRIPT", "LOAD", script)
                loaded.append(True)
            return await self._send("EVALSHA", sha, len(keys), *keys, *args)

        return call

    def lrange(self, name: str, start: int, end: int) -> Awaitable[list[bytes]]:
        return self._send("LRANGE", name, start, end)

    def ping(self) -> Awaitable[Any]:
        return self._send("PING")

    def scan(self, cursor: int = 0, match: str | None = None, count: int | None = None) -> Awaitable[Any]:
        return self._send("SCAN", cursor)

    async def aclose(self) -> None:
        if self.protocol is not None and self.protocol.transport is not None:
            self.protocol.transport.close()


CLIENTS: dict[str, Callable[[str], Any]] = {
    "valkey-py": valkey_py,
    "RespClient": lambda url: connect(url, 2.0),
    "bare floor": Bare,
}


@dataclass
class Figure:
    cpu_us: float
    ops_per_s: float


async def _seed(url: str) -> None:
    client = connect(url, 5.0)
    store = ConversationStore(client)
    await store.delete(READ_KEY)
    for _ in range(ENTRIES // len(EXCHANGE)):
        await store.append(READ_KEY, EXCHANGE, "bench/client", CAP, TTL_SECONDS)
    raw = (await store.read(READ_KEY, READ_LIMIT)).raw_entries
    assert len(raw) == READ_LIMIT, len(raw)
    await client.aclose()


def _operation(store: ConversationStore, op: str) -> Callable[[int], Awaitable[Any]]:
    if op == "read":
        return lambda _task: store.read(READ_KEY, READ_LIMIT)
    # One conversation per task (the proxy's appends land on different keys), capped like the proxy's.
    return lambda task: store.append(f"mem:bench/client:append-{task}", EXCHANGE, "bench/client", CAP, TTL_SECONDS)


async def _measure(make: Callable[[str], Any], url: str, op: str, tasks: int, ops: int) -> Figure:
    client = make(url)
    store = ConversationStore(client)
    run = _operation(store, op)
    per_task = max(1, ops // tasks)

    async def worker(task: int, count: int) -> None:
        for _ in range(count):
            await run(task)

    await asyncio.gather(*(worker(t, 20) for t in range(tasks)))  # connections opened, scripts loaded
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(t, per_task) for t in range(tasks)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await client.aclose()
    done = per_task * tasks
    return Figure(cpu_us=cpu / done * 1e6, ops_per_s=done / wall)


async def _bench(url: str, rounds: int, ops: int) -> None:
    await _seed(url)
    results: dict[tuple[str, int, str], list[Figure]] = {}
    for _ in range(rounds):
        for op in ("read", "append"):
            for tasks in (1, 64):
                for name, make in CLIENTS.items():
                    results.setdefault((op, tasks, name), []).append(await _measure(make, url, op, tasks, ops))
    print(f"{'op':<8}{'tasks':>6}  {'client':<12}{'CPU µs/cmd':>12}{'(min)':>8}{'cmds/s':>10}  vs valkey-py")
    for (op, tasks, name), figures in results.items():
        cpu = statistics.median(f.cpu_us for f in figures)
        rate = statistics.median(f.ops_per_s for f in figures)
        base = statistics.median(f.cpu_us for f in results[(op, tasks, "valkey-py")])
        print(
            f"{op:<8}{tasks:>6}  {name:<12}{cpu:>12.1f}{min(f.cpu_us for f in figures):>8.1f}{rate:>10.0f}"
            f"  {cpu / base:>6.0%} CPU"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="uvloop: as the proxy runs")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=5000, help="commands per measurement")
    options = parser.parse_args()
    server = Valkey()
    server.start()
    try:
        print(f"valkey-server {server.version()}, {options.loop} loop, median of {options.rounds} rounds")
        if options.loop == "uvloop":
            import uvloop

            uvloop.run(_bench(server.url, options.rounds, options.ops))
        else:
            asyncio.run(_bench(server.url, options.rounds, options.ops))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
