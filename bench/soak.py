"""``make soak`` (``python -m bench.soak``): a bounded mixed load through launcher -> proxy -> Valkey (AOF,
``appendfsync always``), all real processes on loopback, with three faults injected while it runs:

1. Valkey SIGKILLed, restarted on its port after a gap;
2. the proxy SIGKILLed, restarted on its port after a gap (the launcher is never restarted);
3. Valkey paused (SIGSTOP) and resumed (SIGCONT): open connections, no answers.

Reported: the load held (ops/s, overall and ok), each fault and how long until the load was whole again,
failed requests by class (status:error type, or the exception), and acknowledged writes lost: every append
the launcher's memory endpoint answered 200, and every managed-loop turn answered ``memory: ok``, is looked
up in Valkey at the end by its message id (or its user input). The target is 0.

``--fsync`` instead measures what the AOF fsync policy costs (append throughput through the proxy, and
straight into Valkey) and risks (acknowledged appends lost across a SIGKILL), for always / everysec / off.

The report is printed and written into docs/reliability.md between its ``soak`` (or ``fsync``) markers
(``--no-write`` to skip). Exit status 1 when an acknowledged write was lost or an unexpected class of
failure (a 500, an untyped error) reached a caller.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sessionmem_proxy.store import ConversationStore, NewEntry
from sessionmem_proxy.valkey_client import connect
from tests.faults.load import LoadResult, MixedLoad, Outcome, lost_acknowledged
from tests.faults.stack import AOF_ALWAYS, AOF_EVERYSEC, AUTH, LOAD_CAP, Stack, running_stack

DOC = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
MAX_OPS = 200_000
# What a caller may see while a part is down: the typed 503 of the memory API. The managed loop answers
# every turn 200 (fail-open), so a turn has no failure class at all.
EXPECTED_FAILURES = {"503:backend_unavailable"}


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    at: float  # seconds into the run
    action: Callable[[Stack], float]  # blocking; returns time.monotonic() when the part is back


@dataclass(frozen=True, slots=True)
class FaultReport:
    name: str
    injected_at: float  # seconds into the run
    back_at: float
    failed_during: int
    degraded_turns: int
    first_ok_after: float | None
    whole_after: float | None  # seconds after the part was back until the last failure (0 if none)


def faults(down_seconds: float, pause_seconds: float, spacing: float) -> list[Fault]:
    return [
        Fault("valkey SIGKILL + restart", spacing, lambda s: s.kill_valkey_and_restart(down_seconds)),
        Fault("proxy SIGKILL + restart", 2 * spacing, lambda s: s.kill_proxy_and_restart(down_seconds)),
        Fault("valkey SIGSTOP/SIGCONT", 3 * spacing, lambda s: s.pause_valkey(pause_seconds)),
    ]


def _bad(outcome: Outcome) -> bool:
    return not outcome.ok or outcome.memory not in (None, "ok")


async def soak(seconds: float, clients: int, turn_clients: int, down: float, pause: float) -> tuple[str, bool]:
    with running_stack(AOF_ALWAYS, with_launcher=True) as stack:
        assert stack.launcher is not None
        memory = MixedLoad(
            f"http://127.0.0.1:{stack.memory_port}", clients=clients, conversations=64, prefix="soak", seed=11
        )
        turns = MixedLoad(
            stack.launcher.base_url, clients=turn_clients, conversations=16, prefix="soak-turn", turns=True, seed=12
        )
        plan = faults(down, pause, spacing=seconds / 4)
        started = time.monotonic()
        loads = [
            asyncio.create_task(memory.run(seconds, MAX_OPS)),
            asyncio.create_task(turns.run(seconds, MAX_OPS)),
        ]
        windows: list[tuple[Fault, float, float]] = []
        for fault in plan:
            await asyncio.sleep(max(0.0, started + fault.at - time.monotonic()))
            injected = time.monotonic()
            back = await asyncio.to_thread(fault.action, stack)
            windows.append((fault, injected, back))
        mem_result, turn_result = await asyncio.gather(*loads)
        lost = lost_acknowledged(mem_result.acked, stack.read_all, turn_result.acked_turns)
        proxy_log = stack.proxy.log_path.read_text(errors="replace")

    reports: list[FaultReport] = []
    for n, (fault, injected, back) in enumerate(windows):
        # A fault's window runs until the next fault (or the end).
        end = windows[n + 1][1] if n + 1 < len(windows) else max(mem_result.finished, turn_result.finished)
        during = mem_result.window(injected, end) + turn_result.window(injected, end)
        bad_after = [o.at - back for o in during if o.at >= back and _bad(o)]
        first_ok = min((o.at - back for o in during if o.at >= back and not _bad(o)), default=None)
        reports.append(
            FaultReport(
                name=fault.name,
                injected_at=injected - started,
                back_at=back - started,
                failed_during=sum(1 for o in during if not o.ok),
                degraded_turns=sum(1 for o in during if o.op == "turn" and o.memory != "ok"),
                first_ok_after=first_ok,
                whole_after=max(bad_after, default=0.0),
            )
        )
    unexpected = {
        c: n for c, n in (mem_result.failures() + turn_result.failures()).items() if c not in EXPECTED_FAILURES
    }
    lost_count = sum(map(len, lost.values()))
    ok = lost_count == 0 and not unexpected and "unhandled error" not in proxy_log
    return _soak_markdown(seconds, clients, turn_clients, mem_result, turn_result, reports, lost_count, unexpected), ok


def _soak_markdown(
    seconds: float,
    clients: int,
    turn_clients: int,
    memory: LoadResult,
    turns: LoadResult,
    reports: list[FaultReport],
    lost: int,
    unexpected: dict[str, int],
) -> str:
    total = len(memory.outcomes) + len(turns.outcomes)
    wall = max(memory.seconds, turns.seconds)
    ok_ops = sum(1 for o in memory.outcomes if o.ok) + sum(1 for o in turns.outcomes if o.ok and o.memory == "ok")
    classes: Counter[str] = memory.by_class() + turns.by_class()
    lines = [
        f"Run: {time.strftime('%Y-%m-%d %H:%M:%S')}, {seconds:.0f} s, {clients} memory-endpoint clients "
        f"(reads/appends) + {turn_clients} managed-loop clients, Valkey `appendfsync always`, "
        f"command `make soak`.",
        "",
        f"- load held: {total} requests in {wall:.1f} s = **{total / wall:.0f} req/s**, of which "
        f"{ok_ops / wall:.0f}/s fully served (memory ok)",
        f"- acknowledged writes: {memory.acked_count()} appends (HTTP 200) + "
        f"{sum(map(len, turns.acked_turns.values()))} turns (`memory: ok`); **lost: {lost}**",
        f"- managed-loop turns: {len(turns.outcomes)}, all answered: "
        f"{'yes' if not turns.failures() else 'NO ' + str(dict(turns.failures()))}; "
        f"memory header {dict(turns.memory_states())}",
        f"- failures by class: {dict(memory.failures() + turns.failures()) or 'none'}; "
        f"unexpected classes: {unexpected or 'none'}",
        f"- requests by class: {dict(sorted(classes.items()))}",
        "",
        "| fault | injected at | back at | failed requests | degraded turns | first ok after back | "
        "whole again after back |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in reports:
        first = f"{r.first_ok_after * 1000:.0f} ms" if r.first_ok_after is not None else "never"
        whole = f"{(r.whole_after or 0.0) * 1000:.0f} ms"
        lines.append(
            f"| {r.name} | {r.injected_at:.1f} s | {r.back_at:.1f} s | {r.failed_during} | {r.degraded_turns} | "
            f"{first} | {whole} |"
        )
    lines.append("")
    lines.append(f"Faults survived: {len(reports)}/{len(reports)} (no process but the faulty one restarted).")
    return "\n".join(lines)


# ---- --fsync: what the AOF policy costs and risks ---------------------------------------------------------

POLICIES: dict[str, tuple[str, ...]] = {
    "always": AOF_ALWAYS,
    "everysec": AOF_EVERYSEC,
    "no AOF": ("--appendonly", "no"),
}


async def _direct_appends(url: str, seconds: float, concurrency: int) -> float:
    """Appends/s straight into Valkey through the store (no HTTP), to isolate the fsync cost."""
    client = connect(url, 2.0)
    store = ConversationStore(client)
    count = 0
    deadline = time.monotonic() + seconds

    async def worker(w: int) -> None:
        nonlocal count
        n = 0
        while time.monotonic() < deadline and count < MAX_OPS:
            n += 1
            await store.append(
                f"mem:bench/direct:c{w % 16}", [NewEntry("user", "x" * 200, f"d{w}-{n}")], "b", 10_000, 600
            )
            count += 1

    started = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    rate = count / (time.monotonic() - started)
    await client.aclose()
    return rate


async def fsync_compare(seconds: float, clients: int) -> str:
    rows = []
    for name, args in POLICIES.items():
        with running_stack(args) as stack:
            direct = await _direct_appends(stack.valkey.url, seconds / 2, 32)
            steady = MixedLoad(stack.proxy.base_url, headers=AUTH, clients=clients, prefix="steady", append_ratio=1.0)
            steady_result = await steady.run(seconds, MAX_OPS)
            # Appends under load, Valkey SIGKILLed in the middle, restarted: what came back from the AOF?
            killed = MixedLoad(
                stack.proxy.base_url,
                headers=AUTH,
                clients=clients,
                prefix="kill",
                append_ratio=1.0,
                query={"cap": LOAD_CAP},
            )
            running = asyncio.create_task(killed.run(4.0, MAX_OPS))
            await asyncio.sleep(2.0)
            await asyncio.to_thread(stack.kill_valkey_and_restart, 0.5)
            kill_result = await running
            lost = lost_acknowledged(kill_result.acked, stack.read_all)
        rows.append(
            f"| {name} | {direct:.0f} | {steady_result.ok_rate():.0f} | {kill_result.acked_count()} | "
            f"{sum(map(len, lost.values()))} |"
        )
    return "\n".join(
        [
            f"Run: {time.strftime('%Y-%m-%d %H:%M:%S')}, command `python -m bench.soak --fsync` "
            f"({seconds:.0f} s per policy, {clients} HTTP clients, 32 direct clients).",
            "",
            "| AOF policy | appends/s straight into Valkey | appends/s through the proxy | "
            "acked appends around the SIGKILL | acked appends lost |",
            "| --- | --- | --- | --- | --- |",
            *rows,
        ]
    )


def write_section(marker: str, text: str, doc: Path = DOC) -> None:
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    body = doc.read_text() if doc.exists() else ""
    block = f"{begin}\n{text}\n{end}"
    if begin in body and end in body:
        body = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, body, flags=re.DOTALL)
    else:
        body += f"\n{block}\n"
    doc.write_text(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=60.0, help="soak duration (bounded: at most 600)")
    parser.add_argument("--clients", type=int, default=6, help="memory-endpoint clients (reads and appends)")
    parser.add_argument("--turn-clients", type=int, default=2, help="managed-loop clients")
    parser.add_argument("--down", type=float, default=2.0, help="seconds Valkey / the proxy stay down")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds Valkey stays SIGSTOPped")
    parser.add_argument("--fsync", action="store_true", help="compare AOF fsync policies instead")
    parser.add_argument("--no-write", action="store_true", help=f"do not update {DOC.name}")
    args = parser.parse_args()
    seconds = min(max(args.seconds, 8.0), 600.0)
    clients = min(max(args.clients, 1), 64)
    if args.fsync:
        text, ok = asyncio.run(fsync_compare(min(seconds, 20.0), clients)), True
        marker = "fsync"
    else:
        text, ok = asyncio.run(soak(seconds, clients, min(max(args.turn_clients, 0), 16), args.down, args.pause))
        marker = "soak"
    print(text)
    if not args.no_write:
        write_section(marker, text)
        print(f"\n(written to {DOC})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
