"""The noisy neighbour: a well-behaved tenant's read latency while another tenant misbehaves on the same proxy.

The victim (one agent) reads the last 40 entries of its conversations on one keep-alive connection, one
request at a time and paced at a rate a busy agent's turns reach, well inside its quota. It is measured in
alternating rounds of the same length: on a quiet proxy, and while a second agent, in a process of its own,
runs big exports of a huge conversation, appends of the largest body the proxy accepts, and a burst of reads
at ten times the victim's own rate, reads of its last 500 entries (~24 MiB stored, answered at most 4 MiB)
and searches of the whole conversation. The figure is the victim's p99 under noise as a ratio of its quiet
p99, each over the samples of every round; the report also gives what the noisy tenant was answered (its
429s and 507s are the quotas doing their work). A second figure is the victim's p99 while strangers (no
credentials) hold connections open with request heads that promise a body and never send it, about a
thousand at once, reopened ~70 a second (``flood``), as a ratio of the same quiet p99. A third is the
victim's p99 while the second agent floods with its own credentials (``greedy``): reads of its last 500
entries and searches of its huge conversation on sixteen connections, each asking again as soon as it is
answered, whatever ``Retry-After`` says (so almost all its requests are refused), as a ratio of the same
quiet p99: what a tenant's refused and admitted flood costs the others.

``python -m bench.noisy`` runs it on its own (the proxy and a valkey-server of its own, then prints the
figures); ``make bench`` runs it as the ``noisy`` section.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from bench.procs import REPO, HttpService, Valkey, base_env, free_port
from sessionmem_core import api, env
from sessionmem_core.devauth import dev_token

VICTIM = ("bench", "victim")
NOISY = ("bench", "noisy")
VICTIM_CONVERSATIONS = 8
VICTIM_ENTRIES = 40
HUGE_ENTRIES = 500
HUGE_ENTRY_CHARS = 48 * 1024  # 500 of these: a ~24 MiB conversation to export
EXPORTERS = 3
# The exporters page through the huge conversation: a page holds about this many of its entries.
PAGE_ENTRIES = 20
APPENDERS = 2
BURST_FACTOR = 10
VICTIM_RPS = 100.0
ROUNDS = 3
# The strangers' flood: connections held at once, and how many are reopened a second.
FLOOD_CONNECTIONS = 1030
FLOOD_REOPEN_PER_SECOND = 70.0
FLOOD_THREADS = 8
# The authenticated greedy flood: connections, each alternating big reads and searches without a pause.
GREEDY_CONNECTIONS = 16


@dataclass
class VictimRun:
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    rps: float


@dataclass
class NoisyResult:
    quiet: VictimRun
    noisy: VictimRun
    p99_ratio: float
    noisy_answers: dict[str, int] = field(default_factory=dict)
    proxy_workers: int = 2
    rounds: int = 1
    # The victim while strangers hold request heads open (``flood``), and that p99 over the quiet one.
    flood: VictimRun | None = None
    flood_p99_ratio: float | None = None
    flood_connections: int = 0
    # The victim while the noisy tenant floods with big reads and searches (``greedy``), and that p99 over
    # the quiet one.
    greedy: VictimRun | None = None
    greedy_p99_ratio: float | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _authorization(owner: tuple[str, str]) -> str:
    return f"Bearer {dev_token(*owner)}"


def _request(
    conn: http.client.HTTPConnection, method: str, path: str, owner: tuple[str, str], body: bytes | None = None
) -> tuple[int, bytes]:
    headers = {"authorization": _authorization(owner)}
    if body is not None:
        headers["content-type"] = "application/json"
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def _noisy_status(
    conn: http.client.HTTPConnection, port: int, method: str, path: str, body: bytes | None = None
) -> tuple[int, http.client.HTTPConnection]:
    """The status of one of the noisy tenant's requests on ``conn`` (0 when the exchange failed) and the
    connection for its next one: a new one after a failure, as a flooding client reconnects at once."""
    try:
        status, _ = _request(conn, method, path, NOISY, body)
    except (OSError, http.client.HTTPException):
        conn.close()
        return 0, http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    return status, conn


def _append_body(count: int, chars: int) -> bytes:
    entries = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x" * chars} for i in range(count)]
    return orjson.dumps({"entries": entries})


def seed(port: int) -> None:
    """The victim's conversations (40 short entries each) and the noisy tenant's huge one."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        short = _append_body(VICTIM_ENTRIES, 300)
        for i in range(VICTIM_CONVERSATIONS):
            status, answer = _request(conn, "POST", api.entries_path(f"victim-{i}"), VICTIM, short)
            if status != 200:
                raise RuntimeError(f"seeding the victim failed: {status} {answer[:200]!r}")
        per_append = max(1, (env.MAX_BODY_BYTES - 4096) // (HUGE_ENTRY_CHARS + 64))
        remaining = HUGE_ENTRIES
        while remaining > 0:
            batch = min(per_append, remaining)
            try:
                status, answer = _request(
                    conn, "POST", api.entries_path("huge"), NOISY, _append_body(batch, HUGE_ENTRY_CHARS)
                )
            except (OSError, http.client.HTTPException):
                # Refused before its body was read, a large upload has its connection closed: reconnect.
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                status, answer = 429, b""
            if status == 429:  # the noisy tenant's transfer rate holds for its seeding too: wait, as told
                time.sleep(0.25)
                continue
            if status != 200:
                raise RuntimeError(f"seeding the huge conversation failed: {status} {answer[:200]!r}")
            remaining -= batch
    finally:
        conn.close()


@dataclass
class VictimSamples:
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0

    def add(self, other: VictimSamples) -> None:
        self.latencies_ms += other.latencies_ms
        self.errors += other.errors
        self.seconds += other.seconds

    def summary(self) -> VictimRun:
        ordered = sorted(self.latencies_ms)
        return VictimRun(
            requests=len(ordered),
            errors=self.errors,
            p50_ms=round(statistics.median(ordered), 3),
            p99_ms=round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
            max_ms=round(ordered[-1], 3),
            rps=round(len(ordered) / self.seconds, 1),
        )


def measure_victim(port: int, seconds: float) -> VictimSamples:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    paths = [f"{api.entries_path(f'victim-{i}')}?limit={VICTIM_ENTRIES}" for i in range(VICTIM_CONVERSATIONS)]
    samples = VictimSamples()
    began = time.perf_counter()
    deadline = began + seconds
    i = 0
    interval = 1.0 / VICTIM_RPS
    try:
        while time.perf_counter() < deadline:
            pause = began + i * interval - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            sent = time.perf_counter()
            try:
                status, _ = _request(conn, "GET", paths[i % len(paths)], VICTIM)
            except (OSError, http.client.HTTPException):
                status = 0
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            samples.latencies_ms.append((time.perf_counter() - sent) * 1000.0)
            samples.errors += status != 200
            i += 1
    finally:
        conn.close()
    samples.seconds = time.perf_counter() - began
    return samples


def _export_page(n: int) -> str:
    """The n-th page an exporter asks for: pages in order, from the start again after the last."""
    return f"{api.export_path('huge')}?{api.OFFSET_PARAM}={n * PAGE_ENTRIES % HUGE_ENTRIES}"


def hammer(port: int, seconds: float, burst_rps: float) -> dict[str, int]:
    """The noisy tenant: exports, maximal appends and a read burst, each on connections of its own, until
    ``seconds`` have passed. Returns how it was answered, by kind and status."""
    answers: Counter[str] = Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    big_body = _append_body(env.MAX_ENTRIES_PER_APPEND, (env.MAX_BODY_BYTES - 8192) // env.MAX_ENTRIES_PER_APPEND - 40)

    def loop(kind: str, method: str, path_of: Any, body: bytes | None, pause: float) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        n = 0
        while time.monotonic() < deadline:
            status, conn = _noisy_status(conn, port, method, path_of(n), body)
            with lock:
                answers[f"{kind} {status}"] += 1
            n += 1
            if pause:
                time.sleep(pause)
        conn.close()

    threads = [threading.Thread(target=loop, args=("export", "GET", _export_page, None, 0)) for _ in range(EXPORTERS)]
    threads += [
        threading.Thread(
            target=loop, args=("append", "POST", lambda n, t=t: api.entries_path(f"big-{t}-{n}"), big_body, 0)
        )
        for t in range(APPENDERS)
    ]
    big_read = f"{api.entries_path('huge')}?limit={HUGE_ENTRIES}"
    search = f"{api.search_path('huge')}?q=needle&limit=50"
    threads.append(threading.Thread(target=loop, args=("bigread", "GET", lambda n: big_read, None, 0)))
    threads.append(threading.Thread(target=loop, args=("search", "GET", lambda n: search, None, 0)))
    burst_path = f"{api.entries_path('huge')}?limit={VICTIM_ENTRIES}"
    threads.append(
        threading.Thread(target=loop, args=("burst", "GET", lambda n: burst_path, None, 1.0 / max(burst_rps, 1.0)))
    )
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return dict(answers)


def greedy(port: int, seconds: float) -> dict[str, int]:
    """The noisy tenant flooding with its own credentials: ``GREEDY_CONNECTIONS`` connections, half reading
    the last 500 entries of its huge conversation and half searching it, each sending its next request as
    soon as the last is answered (never waiting the ``Retry-After`` of a 429), until ``seconds`` have
    passed. Returns how it was answered, by kind and status."""
    answers: Counter[str] = Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    kinds = {
        "bigread": f"{api.entries_path('huge')}?limit={HUGE_ENTRIES}",
        "search": f"{api.search_path('huge')}?q=needle&limit=50",
    }

    def loop(kind: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < deadline:
            status, conn = _noisy_status(conn, port, "GET", kinds[kind])
            with lock:
                answers[f"greedy {kind} {status}"] += 1
        conn.close()

    threads = [threading.Thread(target=loop, args=(sorted(kinds)[i % 2],)) for i in range(GREEDY_CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return dict(answers)


def flood(port: int, seconds: float) -> dict[str, int]:
    """Strangers: request heads without credentials that declare a 100-byte body and never send it,
    ``FLOOD_CONNECTIONS`` of them held at once, the oldest closed and a new one opened
    ``FLOOD_REOPEN_PER_SECOND`` times a second, until ``seconds`` have passed. Returns how many were
    opened and how many the proxy had closed by the time the flood closed them."""
    head = (
        b"POST " + api.entries_path("held").encode() + b" HTTP/1.1\r\nHost: proxy\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    per_thread = FLOOD_CONNECTIONS // FLOOD_THREADS
    pause = FLOOD_THREADS / FLOOD_REOPEN_PER_SECOND

    def opened() -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(head)
        except OSError:
            with lock:
                counts["refused"] += 1
            return None
        with lock:
            counts["opened"] += 1
        return sock

    def close(sock: socket.socket) -> None:
        sock.setblocking(False)
        try:
            sock.recv(65536, socket.MSG_PEEK)  # an answer, or b"" once the proxy closed it
            closed_by_proxy = True
        except BlockingIOError:
            closed_by_proxy = False
        except OSError:
            closed_by_proxy = True
        with lock:
            counts["answered or closed by the proxy" if closed_by_proxy else "still waiting"] += 1
        sock.close()

    def hold() -> None:
        held: list[socket.socket] = []
        while len(held) < per_thread and time.monotonic() < deadline:
            if (sock := opened()) is not None:
                held.append(sock)
        while time.monotonic() < deadline:
            if held:
                close(held.pop(0))
            if (sock := opened()) is not None:
                held.append(sock)
            time.sleep(pause)
        for sock in held:
            close(sock)

    threads = [threading.Thread(target=hold) for _ in range(FLOOD_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return dict(counts)


def hammer_priority() -> list[str]:
    """The noisy tenant's load generator runs only on CPU nobody else wants (SCHED_IDLE; nice 19 where
    ``chrt`` is missing). In a cluster it is a pod on its own CPU; on a small machine it would otherwise
    take the cores the victim's client and the proxy run on, and the figure would measure the machine,
    not how the proxy shares itself. The proxy sees the same flood either way (the noisy answers count it)."""
    if shutil.which("chrt"):
        return ["chrt", "--idle", "0"]
    return ["nice", "-n", "19"]


def run(valkey_url: str, seconds: float, workers: int = 2, rounds: int = ROUNDS) -> NoisyResult:
    """``rounds`` of (quiet, noisy), ``seconds`` each, the samples of each kind pooled: a p99 over one
    short run is set by its few slowest requests and swings from run to run, and alternating the two
    kinds spreads any drift of the machine over both."""
    port = free_port()
    proxy_env = {
        env.AUTH_MODE: "dev",
        env.VALKEY_URL: valkey_url,
        env.PROXY_HOST: "127.0.0.1",
        env.PROXY_PORT: str(port),
    }
    argv = [sys.executable, "-m", "sessionmem_proxy", "--workers", str(workers)]
    svc = HttpService(f"proxy-w{workers}", argv, proxy_env, port)
    svc.start()
    quiet, noisy, flooded, answers = VictimSamples(), VictimSamples(), VictimSamples(), Counter[str]()
    flooded_by_greedy = VictimSamples()
    flood_counts: Counter[str] = Counter()
    try:
        seed(port)
        measure_victim(port, min(1.0, seconds / 3))  # warm-up
        for _ in range(rounds):
            quiet.add(measure_victim(port, seconds))
            noisy_sample, answered = _under_noise(port, seconds)
            noisy.add(noisy_sample)
            answers.update(answered)
            flood_sample, flood_answered = _under_noise(port, seconds, "flood")
            flooded.add(flood_sample)
            flood_counts.update(flood_answered)
            greedy_sample, greedy_answered = _under_noise(port, seconds, "greedy")
            flooded_by_greedy.add(greedy_sample)
            answers.update(greedy_answered)
    finally:
        svc.stop()
    quiet_run, noisy_run, flood_run = quiet.summary(), noisy.summary(), flooded.summary()
    greedy_run = flooded_by_greedy.summary()
    ratio = noisy_run.p99_ms / quiet_run.p99_ms if quiet_run.p99_ms else float("inf")
    flood_ratio = flood_run.p99_ms / quiet_run.p99_ms if quiet_run.p99_ms else float("inf")
    greedy_ratio = greedy_run.p99_ms / quiet_run.p99_ms if quiet_run.p99_ms else float("inf")
    answers.update({f"flood {kind}": count for kind, count in flood_counts.items()})
    return NoisyResult(
        quiet_run,
        noisy_run,
        round(ratio, 2),
        dict(answers),
        workers,
        rounds,
        flood_run,
        round(flood_ratio, 2),
        flood_counts.get("opened", 0),
        greedy_run,
        round(greedy_ratio, 2),
    )


def _under_noise(port: int, seconds: float, kind: str = "hammer") -> tuple[VictimSamples, dict[str, int]]:
    """The victim measured while the noisy tenant (``hammer``, ``greedy``) or the strangers (``flood``), a
    process of their own, load the proxy."""
    noisy_proc = subprocess.Popen(
        [*hammer_priority(), sys.executable, "-m", "bench.noisy", kind, "--port", str(port),
         "--seconds", str(seconds + 1.0), "--burst-rps", str(VICTIM_RPS * BURST_FACTOR)],
        cwd=REPO, env=base_env({}), stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        time.sleep(0.5)  # the noise is under way before the victim is measured again
        samples = measure_victim(port, seconds)
        out, _ = noisy_proc.communicate(timeout=seconds + 90)
    finally:
        if noisy_proc.poll() is None:
            noisy_proc.kill()
            noisy_proc.wait()
    answered: dict[str, int] = json.loads(out or b"{}")
    return samples, answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command")
    hammer_args = sub.add_parser("hammer", help="be the noisy tenant (used by the benchmark itself)")
    hammer_args.add_argument("--port", type=int, required=True)
    hammer_args.add_argument("--seconds", type=float, required=True)
    hammer_args.add_argument("--burst-rps", type=float, required=True)
    flood_args = sub.add_parser("flood", help="be the strangers holding request heads (used by the benchmark)")
    flood_args.add_argument("--port", type=int, required=True)
    flood_args.add_argument("--seconds", type=float, required=True)
    flood_args.add_argument("--burst-rps", type=float, default=0.0, help="unused (the same call as hammer)")
    greedy_args = sub.add_parser("greedy", help="be the tenant flooding with big reads (used by the benchmark)")
    greedy_args.add_argument("--port", type=int, required=True)
    greedy_args.add_argument("--seconds", type=float, required=True)
    greedy_args.add_argument("--burst-rps", type=float, default=0.0, help="unused (the same call as hammer)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per round, quiet and noisy each")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="alternating quiet and noisy rounds, pooled")
    parser.add_argument("--workers", type=int, default=2, help="proxy worker processes")
    args = parser.parse_args()
    if args.command == "hammer":
        print(json.dumps(hammer(args.port, args.seconds, args.burst_rps)), flush=True)
        return
    if args.command == "flood":
        print(json.dumps(flood(args.port, args.seconds)), flush=True)
        return
    if args.command == "greedy":
        print(json.dumps(greedy(args.port, args.seconds)), flush=True)
        return
    valkey = Valkey()
    valkey.start()
    try:
        result = run(valkey.url, args.seconds, args.workers, args.rounds)
    finally:
        valkey.stop()
    print(json.dumps(result.as_json(), indent=2))


if __name__ == "__main__":
    main()
