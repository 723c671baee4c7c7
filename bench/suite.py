"""The whole measurement, in one run: Valkey ceiling, framework ceiling, proxy, full path, sequential
agents, history length, launcher memory and start-up. Every process it starts is its own and is stopped
at the end, whatever happens.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import agents, data, noisy, report, valkey_ceiling
from bench.load import Load, LoadResult, run_load
from bench.procs import (
    HttpService,
    Valkey,
    bench_authorization,
    code_path,
    extract_commit,
    hello,
    launcher,
    machine_busy_seconds,
    proxy,
    rss_kib,
    write_token_file,
)
from sessionmem_core import api

# A run is repeated when processes other than the measured ones took this many cores while it ran
# (another test suite on the same machine, say); the run with the least interference is kept. Before a
# run, the benchmark also waits (a little) for the machine to be quiet. Both are bounded per run.
NOISY_OTHER_CORES = report.NOISY_OTHER_CORES
MAX_ATTEMPTS = 3
AGENT_ROUNDS = 2
QUIET_WAIT_BUDGET_S = 90.0  # over the whole run
RETRY_BUDGET_S = 90.0  # over the whole run
PROXY_OPS = ("read", "append")


@dataclass
class Settings:
    duration: float = 3.0  # measured seconds of a throughput run
    warmup: float = 1.0
    latency_duration: float = 2.0  # measured seconds of a 1-connection latency run
    agent_seconds: float = 2.5
    startup_runs: int = 7
    loadgen: str = "auto"  # auto (wrk if installed) | wrk | pyload
    full_path_proxy_workers: int = 2
    connections: int = 64
    valkey_clients: int = 50
    noisy_seconds: float = 5.0
    sections: frozenset[str] = frozenset()  # empty: all


@dataclass
class Results:
    http: dict[str, dict[str, Any]] = field(default_factory=dict)
    valkey: dict[str, dict[str, Any]] = field(default_factory=dict)
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    launcher: dict[str, Any] = field(default_factory=dict)
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    noisy: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    payload: dict[str, Any] = field(default_factory=dict)


SECTIONS = ("valkey", "hello", "proxy", "history", "full", "agents", "startup", "noisy", "sealing")


class Suite:
    def __init__(self, settings: Settings, log: Callable[[str], None]) -> None:
        self.s = settings
        self.log = log
        self.r = Results()
        self._stack = contextlib.ExitStack()
        self.valkey: Valkey | None = None
        self._auth = (("authorization", bench_authorization()),)
        self._quiet_budget = QUIET_WAIT_BUDGET_S
        self._retry_budget = RETRY_BUDGET_S
        self.r.payload["busy_machine_waits_s"] = 0.0

    def wanted(self, section: str) -> bool:
        return not self.s.sections or section in self.s.sections

    # --- helpers ---

    @contextlib.contextmanager
    def service(self, svc: HttpService) -> Iterator[HttpService]:
        svc.start()
        try:
            rss = sum(rss_kib(pid)["VmRSS"] for pid in svc.process.tree())
            self.r.services[svc.process.name] = {"ready_s": round(svc.ready_seconds, 3), "rss_kib_after_start": rss}
            yield svc
        finally:
            svc.stop()

    def _watch(self, services: Sequence[HttpService]) -> dict[str, list[int]]:
        watch = {svc.process.name: svc.process.tree() for svc in services}
        if self.valkey is not None:
            watch["valkey"] = [self.valkey.process.pid]
        return watch

    def http(
        self,
        key: str,
        label: str,
        port: int,
        paths: Sequence[str],
        connections: int,
        services: Sequence[HttpService],
        *,
        method: str = "GET",
        body: bytes = b"",
        tool: str | None = None,
        auth: tuple[tuple[str, str], ...] | None = None,
    ) -> LoadResult:
        """``auth``: the agent's credential header, the benchmark's one agent's unless given."""
        headers = (auth or self._auth) + ((("content-type", "application/json"),) if body else ())
        latency_run = connections == 1
        load = Load(
            port=port,
            paths=tuple(paths),
            method=method,
            body=body,
            headers=headers,
            connections=connections,
            duration=self.s.latency_duration if latency_run else self.s.duration,
            warmup=self.s.warmup / 2 if latency_run else self.s.warmup,
        )

        # One connection is served by one worker whatever the server does: nothing to spread, nothing to retry.
        def lopsided(result: LoadResult) -> bool:
            return connections > 1 and _imbalanced(result)

        attempts: list[LoadResult] = []
        for _ in range(MAX_ATTEMPTS):
            self._wait_quiet()
            began = time.perf_counter()
            result = run_load(load, self._watch(services), tool or self.s.loadgen)
            attempts.append(result)
            noisy = result.cpu_cores.get("other", 0.0) >= NOISY_OTHER_CORES
            if (not noisy and not lopsided(result)) or self._retry_budget <= 0:
                break
            self._retry_budget -= time.perf_counter() - began
        # Prefer a run whose connections were spread over the workers, then the least disturbed one.
        best = min(attempts, key=lambda a: (lopsided(a), a.cpu_cores.get("other", 0.0)))
        if best.errors:
            self.r.notes.append(f"{label}: {best.errors} error answers or socket errors during the measured run")
        entry = {"label": label, **best.as_json(), "attempts": len(attempts)}
        if len(attempts) > 1:
            entry["attempt_rps"] = [round(a.rps, 1) for a in attempts]
        imbalanced = sum(1 for a in attempts if lopsided(a))
        if imbalanced:
            entry["imbalanced_attempts"] = imbalanced
            self.r.notes.append(
                f"{label}: in {imbalanced} of {len(attempts)} attempts the connections landed (nearly) all on one "
                "worker (each worker has its own SO_REUSEPORT socket; the kernel spreads connections by a hash "
                "of their addresses, so a few connections can land unevenly)"
            )
        self.r.http[key] = entry
        self.log(
            f"  {label:<58} {best.rps:>9.0f} req/s  p50 {best.p50_ms:7.3f} ms  "
            f"cpu {_fmt_cores(best.cpu_cores)}" + (f"  ({len(attempts)} attempts)" if len(attempts) > 1 else "")
        )
        return best

    def _wait_quiet(self, max_wait: float = 10.0) -> None:
        """Wait (within the budget) until the machine is idle apart from us: our servers are idle now."""
        waited = 0.0
        while self._quiet_budget > 0 and waited < max_wait:
            before, began = machine_busy_seconds(), time.perf_counter()
            time.sleep(0.3)
            elapsed = time.perf_counter() - began
            if (machine_busy_seconds() - before) / elapsed < NOISY_OTHER_CORES:
                break
            waited += elapsed
            self._quiet_budget -= elapsed
        self.r.payload["busy_machine_waits_s"] = round(self.r.payload["busy_machine_waits_s"] + waited, 1)

    # --- sections ---

    def run(self) -> Results:
        with self._stack:
            self.valkey = Valkey()
            self.valkey.start()
            self._stack.callback(self.valkey.stop)
            self.r.payload["valkey_version"] = self.valkey.version()
            self._seed()
            if self.wanted("valkey"):
                self.valkey_ceiling()
            if self.wanted("hello"):
                self.framework_ceiling()
            if self.wanted("proxy") or self.wanted("history"):
                self.proxy_one_worker()
            if self.wanted("proxy"):
                self.proxy_before()
            needs_two = self.wanted("proxy") or self.wanted("full") or self.wanted("agents") or self.wanted("startup")
            if needs_two:
                self.proxy_two_workers_and_beyond()
            if self.wanted("noisy"):
                self.noisy_neighbour()
            if self.wanted("sealing"):
                self.sealing_off_and_on()
        return self.r

    def sealing_off_and_on(self) -> None:
        """Encryption at rest's cost: the proxy without it and with it (a directory of data keys, so no API
        server is in the loop; the data key is cached either way), 1 worker each, loaded in turn as
        ``proxy_before`` loads its two proxies. Each reads conversations stored its own way (the sealed one
        500 sealed entries) and appends to conversations of its own, each side as an agent of its own: an
        agent's accounting and catalogue hashes are small-encoded (a listpack, scanned per write) up to
        Valkey's entry limit, so conversations sharing one agent would make whichever side wrote there
        second pay more per append for that alone."""
        assert self.valkey is not None
        self.log("proxy without and with encryption at rest, 1 worker each, loaded in turn")
        root = Path(tempfile.mkdtemp(prefix="sessionmem-bench-sealing-"))
        try:
            keys = data.SealingKeys.make(root)
            url, plain_agent, sealed_agent = self.valkey.url, "sealing-off", "sealing-on"
            for agent, sealing in ((plain_agent, None), (sealed_agent, keys)):
                for prefix, entries in (("r500", data.CAP), ("a", data.CAP - 2)):
                    conversations = [data.proxy_key(c, agent) for c in data.conversation_ids(prefix)]
                    data.seed(url, conversations, entries, sealing, agent)
            with (
                self.service(proxy(url, 1, report.SEALING_TREES["off"])) as off,
                self.service(proxy(url, 1, report.SEALING_TREES["on"], extra_env=keys.proxy_env())) as on,
            ):
                sides = [(off, "off", plain_agent), (on, "on", sealed_agent)]
                for round_ in range(1, report.INTERLEAVED_ROUNDS + 1):
                    for op in PROXY_OPS:
                        for svc, mode, agent in sides if round_ % 2 else sides[::-1]:
                            key = report.sealing_key(mode, op) + report.round_suffix(round_)
                            label = f"proxy {op}, encryption at rest {mode}, 1 worker, 64 conns, round {round_}"
                            auth = (("authorization", bench_authorization(agent)),)
                            if op == "read":
                                self.http(key, label, svc.port, self._read_paths("r500"), 64, [svc], auth=auth)
                            else:
                                paths, body = self._append_paths("a"), data.exchange_body()
                                self.http(key, label, svc.port, paths, 64, [svc], method="POST", body=body, auth=auth)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def noisy_neighbour(self) -> None:
        assert self.valkey is not None
        self.log("noisy neighbour: a victim's read p99, quiet and while another agent misbehaves (2 workers)")
        self._wait_quiet()
        try:
            result = noisy.run(self.valkey.url, self.s.noisy_seconds, workers=2)
        except RuntimeError as exc:
            self.r.notes.append(f"noisy neighbour not measured: {str(exc)[:300]}")
            self.log(f"  FAILED: {str(exc)[-800:]}")
            return
        self.r.noisy = result.as_json()
        self.log(
            f"  victim p99 {result.quiet.p99_ms:.3f} ms quiet, {result.noisy.p99_ms:.3f} ms noisy "
            f"({result.p99_ratio:.2f}x); noisy tenant answered {result.noisy_answers}"
        )
        if result.greedy is not None:
            self.log(
                f"  victim p99 {result.greedy.p99_ms:.3f} ms while the neighbour floods with big reads "
                f"({result.greedy_p99_ratio:.2f}x)"
            )

    def _seed(self) -> None:
        assert self.valkey is not None
        started = time.perf_counter()
        url = self.valkey.url
        data.seed(url, [data.proxy_key(c) for c in data.conversation_ids("r500")], data.CAP)
        data.seed(url, [data.proxy_key(c) for c in data.conversation_ids("r40")], data.READ_LIMIT)
        # Append targets start two entries below the cap: every measured append trims (the steady state).
        data.seed(url, [data.proxy_key(c) for c in data.conversation_ids("a")], data.CAP - 2)
        data.seed(url, [data.proxy_key(c) for c in data.conversation_ids("b")], data.CAP - 2)
        data.seed(url, data.ceiling_keys("read"), data.CAP)
        data.seed(url, data.ceiling_keys("append"), data.CAP - 2)
        entry_bytes = data.stored_entry_bytes(url, data.proxy_key("r500-0"))
        self.r.payload.update(
            {
                "user_chars": len(data.USER_TEXT),
                "assistant_chars": len(data.ASSISTANT_TEXT),
                "stored_entry_bytes_avg": entry_bytes,
                "append_body_bytes": len(data.exchange_body()),
                "conversations_per_load": data.CONVERSATIONS,
            }
        )
        self.log(f"seeded Valkey in {time.perf_counter() - started:.1f}s (stored entry ~{entry_bytes} bytes)")

    def valkey_ceiling(self) -> None:
        assert self.valkey is not None
        port = self.valkey.port
        self.log("raw Valkey ceiling (same operations as the proxy)")
        tool = valkey_ceiling.benchmark_tool()
        for op in ("read", "append"):
            for clients in (1, self.s.valkey_clients):
                if tool is not None:
                    requests = 40_000 if clients == 1 else 200_000
                    valkey_ceiling.run_tool(port, op, clients, requests // 10, data.CONVERSATIONS)  # warm-up
                    result = valkey_ceiling.run_tool(port, op, clients, requests, data.CONVERSATIONS)
                else:
                    result = valkey_ceiling.run_python(port, op, clients, self.s.latency_duration, data.CONVERSATIONS)
                    self.r.notes.append("no valkey-benchmark/redis-benchmark: the Valkey ceiling is client-bound")
                self.r.valkey[f"{op}.c{clients}"] = result.as_json()
                self.log(
                    f"  {result.tool} {op:<6} {clients:>3} clients {result.rps:>9.0f} ops/s  p50 {result.p50_ms:.3f} ms"
                )
        for op in ("read", "append"):
            result = valkey_ceiling.run_python(port, op, 1, self.s.latency_duration, data.CONVERSATIONS)
            self.r.valkey[f"{op}.c1.valkey-py"] = result.as_json()
            self.log(f"  {result.tool} {op:<6}   1 client  {result.rps:>9.0f} ops/s  p50 {result.p50_ms:.3f} ms")

    def framework_ceiling(self) -> None:
        self.log("framework ceiling: FastAPI hello world, uvicorn + uvloop + httptools")
        for workers in (1, 2):
            with self.service(hello(workers)) as svc:
                self.http(
                    f"hello.w{workers}.c64",
                    f"hello world, {workers} worker(s), 64 conns",
                    svc.port,
                    ["/hello"],
                    self.s.connections,
                    [svc],
                )
                if workers == 1:
                    self.http("hello.w1.c1", "hello world, 1 worker, 1 conn", svc.port, ["/hello"], 1, [svc])
                    if self.s.loadgen != "pyload":
                        # The load generator check: the same load from the Python generator.
                        self.http(
                            "hello.w1.c64.pyload",
                            "hello world, 1 worker, 64 conns (bench.pyload)",
                            svc.port,
                            ["/hello"],
                            self.s.connections,
                            [svc],
                            tool="pyload",
                        )

    def _read_paths(self, prefix: str) -> list[str]:
        return [f"{api.entries_path(c)}?limit={data.READ_LIMIT}" for c in data.conversation_ids(prefix)]

    def _append_paths(self, prefix: str = "a") -> list[str]:
        return [api.entries_path(c) for c in data.conversation_ids(prefix)]

    def proxy_one_worker(self) -> None:
        assert self.valkey is not None
        self.log("proxy, 1 worker")
        with self.service(proxy(self.valkey.url, 1)) as svc:
            reads, appends, body = self._read_paths("r500"), self._append_paths(), data.exchange_body()
            if self.wanted("proxy"):
                self._proxy_loads(svc, "proxy.w1", "proxy {op}, 1 worker, 64 conns", 64)
                self.http("proxy.w1.read.c1", "proxy read(40), 1 worker, 1 conn", svc.port, reads, 1, [svc])
                self.http(
                    "proxy.w1.append.c1",
                    "proxy append(2), 1 worker, 1 conn",
                    svc.port,
                    appends,
                    1,
                    [svc],
                    method="POST",
                    body=body,
                )
            if self.wanted("history"):
                # Interleaved, twice each, so drift on a shared machine hits both sides alike.
                for round_ in (1, 2):
                    for size in ("r500", "r40"):
                        self.http(
                            f"history.{size}.c1.{round_}",
                            f"proxy read(40) of a {size[1:]}-entry history, 1 conn",
                            svc.port,
                            self._read_paths(size),
                            1,
                            [svc],
                        )

    def _proxy_loads(
        self,
        svc: HttpService,
        key: str,
        label: str,
        connections: int,
        append_prefix: str = "a",
        round_: int | None = None,
        ops: Sequence[str] = PROXY_OPS,
    ) -> None:
        """The read(40) and append(2) loads (or those of ``ops``) on one proxy: results ``<key>.read.c<N>``
        and ``<key>.append.c<N>`` (with ``report.round_suffix`` for a round), labelled ``label`` with
        ``{op}`` filled in."""
        suffix = "" if round_ is None else report.round_suffix(round_)
        if "read" in ops:
            self.http(
                f"{key}.read.c{connections}{suffix}",
                label.format(op="read(40)"),
                svc.port,
                self._read_paths("r500"),
                connections,
                [svc],
            )
        if "append" in ops:
            self.http(
                f"{key}.append.c{connections}{suffix}", label.format(op="append(2)"), svc.port,
                self._append_paths(append_prefix), connections, [svc], method="POST", body=data.exchange_body(),
            )  # fmt: skip

    def proxy_before(self) -> None:
        """The proxy of the commit issue #17's budgets compare with, against this one, in this run on this
        machine with the same loads: a figure stored from another day is off by the machine's drift (up to
        a fifth between days here), and two runs a minute apart on this VM differ by up to a quarter. So
        both proxies run side by side and are loaded in turn, one operation at a time: in each of
        ``report.INTERLEAVED_ROUNDS`` rounds both take the read load, then both the append load, the order
        flipped each round, so the two runs compared follow each other (this VM's speed also drifts within
        a minute). The report takes the median of the rounds' ratios. The baseline's appends go to
        conversations of their own, seeded alike."""
        assert self.valkey is not None
        try:
            commit, code = extract_commit(report.BASELINE_COMMIT, ("core", "proxy"))
        except (OSError, subprocess.CalledProcessError) as exc:
            self.r.notes.append(
                f"{report.BASELINE_COMMIT} not measured in this run ({exc}): compared with its stored run"
            )
            return
        self.log(f"proxy of {commit} (before issue #17) and this one, 1 worker each, loaded in turn")
        try:
            with (
                self.service(proxy(self.valkey.url, 1, report.BEFORE_TREE, code_path(code, ("core", "proxy")))) as old,
                self.service(proxy(self.valkey.url, 1)) as new,
            ):
                sides = [
                    (old, report.before_key("proxy.w1"), f"{commit} proxy {{op}}, 1 worker, 64 conns", "b"),
                    (new, report.interleaved_key("proxy.w1"), "proxy {op}, 1 worker, 64 conns", "a"),
                ]
                for round_ in range(1, report.INTERLEAVED_ROUNDS + 1):
                    # One operation at a time on both sides, so each pair compared is measured back to back.
                    for op in PROXY_OPS:
                        for svc, key, label, prefix in sides if round_ % 2 else sides[::-1]:
                            self._proxy_loads(svc, key, f"{label}, round {round_}", 64, prefix, round_, ops=(op,))
        finally:
            shutil.rmtree(code, ignore_errors=True)

    def proxy_two_workers_and_beyond(self) -> None:
        assert self.valkey is not None
        workers = 2
        self.log("proxy, 2 workers")
        with self.service(proxy(self.valkey.url, workers)) as svc:
            if self.wanted("proxy"):
                self._proxy_loads(svc, "proxy.w2", "proxy {op}, 2 workers, 64 conns", 64)
            if self.s.full_path_proxy_workers != workers and (self.wanted("full") or self.wanted("agents")):
                svc.stop()
                svc = self._stack.enter_context(self.service(proxy(self.valkey.url, self.s.full_path_proxy_workers)))
            self.full_path(svc)

    def full_path(self, proxy_svc: HttpService) -> None:
        token = write_token_file()
        self._stack.callback(token.unlink)
        if self.wanted("full") or self.wanted("agents"):
            self.log(f"full path: client -> launcher -> proxy ({self.s.full_path_proxy_workers} workers) -> Valkey")
            try:
                self._full_path_and_agents(proxy_svc, token)
            except RuntimeError as exc:  # the launcher did not start: the rest of the run still counts
                self.r.notes.append(f"full path and agents not measured: {str(exc)[:300]}")
                self.log(f"  FAILED: {str(exc)[-800:]}")
        if self.wanted("startup"):
            try:
                self.launcher_startup(proxy_svc.port, token)
            except RuntimeError as exc:
                self.r.notes.append(f"launcher start-up not measured: {str(exc)[:300]}")
                self.log(f"  FAILED: {str(exc)[-800:]}")

    def _full_path_and_agents(self, proxy_svc: HttpService, token: Path) -> None:
        with self.service(launcher(proxy_svc.port, token)) as lsvc:
            after_start = rss_kib(lsvc.process.pid)
            both = [lsvc, proxy_svc]
            if self.wanted("full"):
                reads, appends, body = self._read_paths("r500"), self._append_paths(), data.exchange_body()
                self.http("full.read.c1", "full path read(40), 1 conn", lsvc.port, reads, 1, both)
                self.http(
                    "full.append.c1",
                    "full path append(2), 1 conn",
                    lsvc.port,
                    appends,
                    1,
                    both,
                    method="POST",
                    body=body,
                )
                self.http("full.read.c64", "full path read(40), 64 conns", lsvc.port, reads, 64, both)
                self.http(
                    "full.append.c64",
                    "full path append(2), 64 conns",
                    lsvc.port,
                    appends,
                    64,
                    both,
                    method="POST",
                    body=body,
                )
            after_load = rss_kib(lsvc.process.pid)
            self.r.launcher.update(
                {
                    "rss_kib_after_start": after_start["VmRSS"],
                    "rss_kib_after_load": after_load["VmRSS"],
                    "rss_kib_peak": after_load["VmHWM"],
                }
            )
            self.log(
                f"  launcher RSS {after_start['VmRSS'] / 1024:.1f} MiB after start, "
                f"{after_load['VmRSS'] / 1024:.1f} MiB after load (peak {after_load['VmHWM'] / 1024:.1f} MiB)"
            )
            if self.wanted("agents"):
                self.sequential_agents(lsvc.port)

    def sequential_agents(self, launcher_port: int) -> None:
        assert self.valkey is not None
        self.log("sequential agent, memory cost per turn (read 40 + append the exchange)")
        warm, vport = min(0.5, self.s.warmup), self.valkey.port
        secs = self.s.agent_seconds / AGENT_ROUNDS
        runs: list[tuple[str, Callable[[], agents.AgentResult]]] = [
            ("sessionmem.raw", lambda: agents.sessionmem_raw(launcher_port, warm, secs)),
            ("sessionmem.agents_session", lambda: agents.sessionmem_agents_session(launcher_port, warm, secs)),
            ("openai_agents.redis_session", lambda: agents.openai_agents_redis_session(vport, warm, secs, None)),
            ("openai_agents.redis_session_ttl", lambda: agents.openai_agents_redis_session(vport, warm, secs, 86400)),
            ("sessionmem.langchain", lambda: agents.sessionmem_langchain(launcher_port, warm, secs)),
            ("langchain.redis_history", lambda: agents.langchain_redis_history(vport, warm, secs)),
        ]
        # Two rounds, each variant once per round, and every round on an emptied Valkey (each variant seeds
        # its own conversations): drift on a shared machine then hits every variant alike, as in the
        # history rows, and no peer reads a longer list in its second round.
        rounds: dict[str, list[agents.AgentResult]] = {key: [] for key, _ in runs}
        busy_cores: dict[str, list[float]] = {key: [] for key, _ in runs}
        for _ in range(AGENT_ROUNDS):
            self.valkey.flush_all()
            for key, run in runs:
                self._wait_quiet()
                busy, began = machine_busy_seconds(), time.perf_counter()
                rounds[key].append(run())
                # Everything this variant kept busy (agent, launcher, proxy, Valkey) plus any other job.
                busy_cores[key].append((machine_busy_seconds() - busy) / (time.perf_counter() - began))
        for key, _ in runs:
            result = agents.merged(rounds[key])
            self.r.agents[key] = result.as_json()
            self.r.agents[key]["machine_cores"] = round(statistics.fmean(busy_cores[key]), 2)
            if result.error:
                self.r.notes.append(f"agent variant {result.name} did not run: {result.error}")
                self.log(f"  {result.name:<46} FAILED {result.error}")
            else:
                self.log(f"  {result.name:<46} {result.mean_ms:7.3f} ms/turn mean, p50 {result.p50_ms:7.3f} ms")

    def launcher_startup(self, proxy_port: int, token: Path) -> None:
        self.log(f"launcher start-up, {self.s.startup_runs} runs (exec -> first 200 on /healthz of the memory port)")
        ready: list[float] = []
        rss: list[int] = []
        for _ in range(self.s.startup_runs):
            self._wait_quiet()
            svc = launcher(proxy_port, token)
            svc.start()
            try:
                ready.append(svc.ready_seconds)
                rss.append(rss_kib(svc.process.pid)["VmRSS"])
            finally:
                svc.stop()
        self.r.launcher.update(
            {
                "ready_s_runs": [round(r, 4) for r in ready],
                "ready_s_median": round(statistics.median(ready), 4),
                "rss_kib_at_ready_runs": rss,
                "rss_kib_at_ready_median": int(statistics.median(rss)),
            }
        )
        self.log(
            f"  ready median {statistics.median(ready) * 1000:.0f} ms (runs: "
            + ", ".join(f"{r * 1000:.0f}" for r in ready)
            + f" ms), RSS at ready median {statistics.median(rss) / 1024:.1f} MiB"
        )


def workers_of(name: str) -> int:
    """The worker count in a service name like ``proxy-w2`` (1 when it has none)."""
    head, _, count = name.rpartition("-w")
    return int(count) if head and count.isdigit() else 1


def _imbalanced(result: LoadResult) -> bool:
    """A multi-worker server on which one worker did less than a third of the other's work."""
    for name, per_process in result.cpu_cores_by_process.items():
        workers = workers_of(name)
        if workers > 1 and len(per_process) >= workers:
            busiest = per_process[:workers]
            if busiest[0] > 0.2 and busiest[-1] < busiest[0] / 3:
                return True
    return False


def _fmt_cores(cores: Mapping[str, float]) -> str:
    return " ".join(f"{k}={v:.2f}" for k, v in cores.items() if k != "machine")
