"""``python -m bench.path_history REV [REV ...]``: the full path's cost per turn with other commits' proxy
and launcher, on this machine, side by side.

Each revision's proxy (one worker pool, as ``make bench`` runs it) and launcher are started from its
``git archive`` (``.`` is the working tree) against one valkey-server; the turns go through the launcher
with a keep-alive client, rounds alternating between the revisions so the machine's drift lands on all of
them. A turn is what every commit's API takes: a read of 40 then the append of a plain {user, assistant}
pair, on conversations seeded with 40 entries and retired after 20 turns (as ``bench.agents``). For
finding which change moved the path's cost between two commits (docs/benchmarks.md, "The path's cost by
commit"); the figures it prints are per revision: p50 of the read, the append and the turn, in ms.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench.agents import SEED_ENTRIES, TURNS_PER_CONVERSATION, KeepAliveHTTP
from bench.data import ASSISTANT_TEXT, READ_LIMIT, USER_TEXT
from bench.procs import HttpService, Valkey, code_path, extract_commit, launcher, proxy, write_token_file

# Every component a revision may have (older ones have no infra/); code_path skips what is missing.
_COMPONENTS = ("core", "infra", "proxy", "launcher", "client")
WORKING_TREE = "."


@dataclass
class Revision:
    name: str
    pythonpath: str | None
    launcher_port: int = 0
    reads: list[float] = field(default_factory=list)
    appends: list[float] = field(default_factory=list)

    def turns(self, last: int = 0) -> list[float]:
        """Each timed turn's read and append together (the ``last`` ones only, when given)."""
        return [r + a for r, a in zip(self.reads[-last:], self.appends[-last:], strict=True)]


def _entries_path(conversation: str) -> str:
    return f"/v1/conversations/{conversation}/entries"


def _bodies() -> tuple[bytes, bytes]:
    seed = [
        {"role": "user", "content": USER_TEXT} if i % 2 == 0 else {"role": "assistant", "content": ASSISTANT_TEXT}
        for i in range(SEED_ENTRIES)
    ]
    pair = [{"role": "user", "content": USER_TEXT}, {"role": "assistant", "content": ASSISTANT_TEXT}]
    return orjson.dumps({"entries": seed}), orjson.dumps({"entries": pair})


def _checked(status: int, body: bytes, what: str) -> None:
    if status != 200:
        raise RuntimeError(f"{what}: {status} {body[:200]!r}")


def run_round(revision: Revision, turns: int, tag: str) -> None:
    """``turns`` timed turns through ``revision``'s launcher, appended to its samples."""
    http = KeepAliveHTTP(revision.launcher_port)
    seed, pair = _bodies()
    path = ""
    try:
        for index in range(turns):
            if index % TURNS_PER_CONVERSATION == 0:
                path = _entries_path(f"history-{tag}-{index}")
                _checked(*http.request("POST", path, seed), "seeding")
            began = time.perf_counter()
            status, body = http.request("GET", f"{path}?limit={READ_LIMIT}")
            read = time.perf_counter()
            _checked(status, body, "read")
            status, body = http.request("POST", path, pair)
            appended = time.perf_counter()
            _checked(status, body, "append")
            revision.reads.append(read - began)
            revision.appends.append(appended - read)
    finally:
        http.close()


@contextmanager
def _stack(revision: Revision, valkey_url: str, token: Path, workers: int) -> Iterator[None]:
    proxy_service = proxy(valkey_url, workers, name=f"proxy-{revision.name}", pythonpath=revision.pythonpath)
    proxy_service.start()
    launcher_service: HttpService | None = None
    try:
        launcher_service = launcher(proxy_service.port, token)
        if revision.pythonpath:
            launcher_service.process.env["PYTHONPATH"] = revision.pythonpath
        launcher_service.start()
        revision.launcher_port = launcher_service.port
        yield
    finally:
        if launcher_service is not None:
            launcher_service.stop()
        proxy_service.stop()


def _ms(samples: Sequence[float]) -> float:
    return statistics.median(samples) * 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.path_history", description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="+", help=f"commits to compare ({WORKING_TREE!r}: the working tree)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each revision once per round (3)")
    parser.add_argument("--turns", type=int, default=800, help="timed turns per revision per round (800)")
    parser.add_argument("--workers", type=int, default=2, help="proxy workers (2, as make bench)")
    args = parser.parse_args(argv)
    extracted: list[Path] = []
    revisions: list[Revision] = []
    for rev in args.revisions:
        if rev == WORKING_TREE:
            revisions.append(Revision(WORKING_TREE, None))
            continue
        commit, target = extract_commit(rev, _COMPONENTS)
        extracted.append(target)
        pythonpath = code_path(target, _COMPONENTS)
        revisions.append(Revision(commit, pythonpath))
    valkey = Valkey()
    token = write_token_file()
    try:
        valkey.start()
        with ExitStack() as stack:
            for revision in revisions:
                stack.enter_context(_stack(revision, valkey.url, token, args.workers))
            for revision in revisions:  # warm-up, untimed
                run_round(revision, TURNS_PER_CONVERSATION * 5, f"warm-{revision.name}")
                revision.reads.clear()
                revision.appends.clear()
            for number in range(args.rounds):
                order = revisions if number % 2 == 0 else list(reversed(revisions))
                for revision in order:
                    run_round(revision, args.turns, f"{number}-{revision.name}")
                    latest = _ms(revision.turns(args.turns))
                    print(f"round {number + 1}  {revision.name:10s} turn p50 {latest:.3f} ms", flush=True)
        print("\nrevision    read p50 ms  append p50 ms  turn p50 ms  turns")
        for revision in revisions:
            turns = revision.turns()
            print(
                f"{revision.name:10s}  {_ms(revision.reads):11.3f}  {_ms(revision.appends):13.3f}"
                f"  {_ms(turns):11.3f}  {len(turns):5d}"
            )
    finally:
        valkey.stop()
        token.unlink(missing_ok=True)
        for target in extracted:
            shutil.rmtree(target, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
