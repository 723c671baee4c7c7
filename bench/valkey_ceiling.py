"""The raw Valkey ceiling for the operations the proxy does: the store's append script (one exchange of 2
entries: RPUSH, LTRIM to the cap, EXPIRE) and LRANGE of the last 40, one request at a time per client.

Measured with valkey-benchmark when installed, else redis-benchmark (Debian's ``redis-tools``; the same
RESP protocol and command set, and a C client, so the figure is Valkey's and not the client's). Without
either, an asyncio load with valkey-py (the proxy's own client) stands in, and the result says so: that
figure is bounded by the Python client, not by Valkey.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import statistics
import subprocess
import time
from collections.abc import Awaitable
from dataclasses import asdict, dataclass
from typing import Any, cast

import valkey
import valkey.asyncio as valkey_async

from bench.data import ASSISTANT_TEXT, CAP, OWNER, READ_LIMIT, TTL_SECONDS, USER_TEXT
from sessionmem_proxy.store import APPEND_SCRIPT, NewEntry
from sessionmem_proxy.store import append_args as store_append_args

_FIGURES = re.compile(r'"([0-9]+(?:\.[0-9]+)?)"')


@dataclass
class CeilingResult:
    tool: str
    op: str
    clients: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def benchmark_tool() -> str | None:
    return shutil.which("valkey-benchmark") or shutil.which("redis-benchmark")


def append_args() -> list[str]:
    """The append script's ARGV for one exchange, exactly as ConversationStore.append builds it."""
    entries = [NewEntry(role="user", content=USER_TEXT), NewEntry(role="assistant", content=ASSISTANT_TEXT)]
    return [
        a.decode() if isinstance(a, bytes) else str(a)
        for a in store_append_args(entries, OWNER.author, CAP, TTL_SECONDS)
    ]


def load_append_script(port: int) -> str:
    return str(valkey.Valkey(host="127.0.0.1", port=port).script_load(APPEND_SCRIPT))


def _command(kind: str, sha: str) -> list[str]:
    if kind == "append":
        return ["EVALSHA", sha, "1", "bench:ceiling:append:__rand_int__", *append_args()]
    return ["LRANGE", "bench:ceiling:read:__rand_int__", str(-READ_LIMIT), "-1"]


def run_tool(port: int, kind: str, clients: int, requests: int, keyspace: int) -> CeilingResult:
    tool = benchmark_tool()
    assert tool is not None
    sha = load_append_script(port)
    argv = [tool, "-h", "127.0.0.1", "-p", str(port), "-c", str(clients), "-n", str(requests)]
    argv += ["-r", str(keyspace), "-P", "1", "--csv", *_command(kind, sha)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    # --csv: "test","rps","avg","min","p50","p95","p99","max"; the test name is the command itself, quotes
    # and commas included, so the figures are read from the end of the line.
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    figures = _FIGURES.findall(lines[-1]) if len(lines) >= 2 else []
    if len(figures) < 7:
        raise RuntimeError(f"{tool} printed no result: {done.stdout[-500:]} {done.stderr[-500:]}")
    row = dict(zip(("rps", "avg", "min", "p50", "p95", "p99", "max"), figures[-7:], strict=True))
    return CeilingResult(
        tool=tool.rsplit("/", 1)[-1],
        op=kind,
        clients=clients,
        requests=requests,
        rps=float(row["rps"]),
        p50_ms=float(row["p50"]),
        p99_ms=float(row["p99"]),
    )


async def _python_load(port: int, kind: str, clients: int, seconds: float, keyspace: int) -> CeilingResult:
    client = valkey_async.Valkey(host="127.0.0.1", port=port, max_connections=clients)
    script = client.register_script(APPEND_SCRIPT)
    args = append_args()
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker(n: int) -> None:
        i = n
        while time.perf_counter() < deadline:
            key_index = f"{i % keyspace:012d}"
            i += clients
            started = time.perf_counter()
            if kind == "append":
                await script(keys=[f"bench:ceiling:append:{key_index}"], args=args)
            else:
                await cast(Awaitable[list[bytes]], client.lrange(f"bench:ceiling:read:{key_index}", -READ_LIMIT, -1))
            latencies.append(time.perf_counter() - started)

    try:
        await worker(0)  # warm: the script is loaded and a connection is open
        latencies.clear()
        deadline = time.perf_counter() + seconds
        await asyncio.gather(*(worker(n) for n in range(clients)))
    finally:
        await client.aclose()
    latencies.sort()
    return CeilingResult(
        tool="valkey-py asyncio",
        op=kind,
        clients=clients,
        requests=len(latencies),
        rps=len(latencies) / seconds,
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=latencies[int(len(latencies) * 0.99)] * 1000,
    )


def run_python(port: int, kind: str, clients: int, seconds: float, keyspace: int) -> CeilingResult:
    """valkey-py asyncio (what the proxy itself uses): a client-bound figure, not Valkey's ceiling."""
    try:
        import uvloop

        return uvloop.run(_python_load(port, kind, clients, seconds, keyspace))
    except ImportError:
        return asyncio.run(_python_load(port, kind, clients, seconds, keyspace))
