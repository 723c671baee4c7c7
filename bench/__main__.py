"""``make bench`` (``python -m bench``): every figure of docs/benchmarks.md, measured side by side in one run.

Prints a table, writes ``bench/results/latest.json`` and the generated part of ``docs/benchmarks.md``.
Everything runs on 127.0.0.1, each load bounded in time; the whole run takes a few minutes on 2 cores.

The load generator is wrk and the Valkey ceiling is measured with valkey-benchmark or redis-benchmark
(Debian's ``wrk`` and ``redis-tools``): when they are missing and this runs as root with apt-get, they are
installed first (``--no-install`` skips that; the Python fallbacks then stand in, and the report says so).
The comparison libraries (openai-agents, langchain-community, redis) come from requirements-bench.txt,
installed into the running interpreter's environment the same way when they are missing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import report
from bench.load import wrk_path
from bench.procs import CODE_COMMIT_ENV, REPO, reexec_at_commit
from bench.suite import SECTIONS, Settings, Suite
from bench.valkey_ceiling import benchmark_tool

RESULTS = REPO / "bench" / "results" / "latest.json"
DOC = REPO / "docs" / "benchmarks.md"
REQUIREMENTS = REPO / "requirements-bench.txt"
PACKAGES = (
    "granian",
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "httpx",
    "valkey",
    "libvalkey",
    "pydantic",
)
COMPARED = ("openai-agents", "redis", "langchain-community", "langchain-core")


_LOADAVG_AT_START: tuple[float, float, float] | None = None


def _log(message: str) -> None:
    print(message, flush=True)


def _ensure_tools(install: bool) -> None:
    missing = [] if wrk_path() else ["wrk"]
    if benchmark_tool() is None:
        missing.append("redis-tools")
    if not missing or not install:
        return
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        _log(f"note: {', '.join(missing)} not installed (and no root apt-get): using the Python fallbacks")
        return
    _log(f"installing {', '.join(missing)} with apt-get (Debian packages; --no-install skips this)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = [apt, "install", "-y", "-qq", *missing]
    if subprocess.run(argv, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run([apt, "update", "-qq"], env=env, capture_output=True, check=False)
        subprocess.run(argv, env=env, capture_output=True, check=False)


def _ensure_packages(install: bool) -> None:
    modules = ("agents", "redis", "langchain_community", "langchain_core")
    missing = []
    for module in modules:
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if not missing or not install:
        return
    _log(f"installing {REQUIREMENTS.name} (missing: {', '.join(missing)})")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", str(REQUIREMENTS)],
        check=False,
    )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _tool_version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "not installed"
    text = (done.stdout or done.stderr).strip().splitlines()
    return text[0].split(" [")[0].split(" Copyright")[0] if text else "?"


def _machine() -> dict[str, Any]:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.partition(":")[2].strip()
            break
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    os_name = platform.system()
    with_release = Path("/etc/os-release")
    if with_release.exists():
        for line in with_release.read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.partition("=")[2].strip('"')
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "os": os_name,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": _LOADAVG_AT_START or os.getloadavg(),
    }


def _code() -> dict[str, Any]:
    """Which code was measured: the packages' locations, and the repository's commit and local changes."""
    import sessionmem_core
    import sessionmem_launcher
    import sessionmem_proxy

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    changed = git("status", "--porcelain", "--", "core", "proxy", "launcher").splitlines()
    return {
        "commit": os.environ.get(CODE_COMMIT_ENV) or git("rev-parse", "--short", "HEAD") or "?",
        "uncommitted_changes_in_core_proxy_launcher": len(changed),
        "packages_from": sorted(
            {
                str(Path(m.__file__ or "?").parent.parent)
                for m in (sessionmem_core, sessionmem_proxy, sessionmem_launcher)
            }
        ),
    }


def _meta(command: str, elapsed: float, valkey_version: str) -> dict[str, Any]:
    machine = _machine()
    wrk = wrk_path()
    bench_tool = benchmark_tool()
    software = {p: _version(p) for p in (*PACKAGES, *COMPARED)}
    software["valkey-server"] = valkey_version
    software["load generator"] = _tool_version([wrk, "-v"]) if wrk else "bench.pyload (wrk not installed)"
    software["valkey ceiling tool"] = _tool_version([bench_tool, "--version"]) if bench_tool else "not installed"
    return {
        "command": command,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "elapsed_s": round(elapsed, 1),
        "machine": machine,
        "software": software,
        "machine_line": (
            f"{machine['cores']} cores ({machine['cpu']}), {machine['memory_gib']} GiB, {machine['os']}, "
            f"Linux {machine['kernel']}, Python {machine['python']}"
        ),
        "software_line": ", ".join(f"{k} {v}" for k, v in software.items()),
        "code": _code(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per throughput run (3)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds before each run (1)")
    parser.add_argument("--latency-duration", type=float, default=2.0, help="measured seconds per 1-conn run (2)")
    parser.add_argument("--agent-seconds", type=float, default=2.5, help="measured seconds per agent variant")
    parser.add_argument("--startup-runs", type=int, default=7, help="launcher start-up runs (7)")
    parser.add_argument("--loadgen", choices=("auto", "wrk", "pyload"), default="auto")
    parser.add_argument("--full-path-proxy-workers", type=int, default=2)
    parser.add_argument("--only", default="", help=f"comma-separated sections: {','.join(SECTIONS)}")
    parser.add_argument("--no-install", action="store_true", help="do not install missing tools or packages")
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite docs/benchmarks.md")
    parser.add_argument(
        "--no-priority",
        action="store_true",
        help="do not raise the scheduling priority (nice -10) of the benchmark and the processes it starts",
    )
    parser.add_argument("--out", type=Path, default=None, help="results file (bench/results/latest.json)")
    parser.add_argument(
        "--at-commit",
        metavar="REV",
        help="measure the proxy, launcher and core of this commit (e.g. HEAD), not the working tree's files",
    )
    args = parser.parse_args(argv)
    sections = frozenset(s.strip() for s in args.only.split(",") if s.strip())
    unknown = sections - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")

    if args.at_commit:
        reexec_at_commit(args.at_commit, "bench", [a for a in (argv or sys.argv[1:])])
    _ensure_tools(not args.no_install)
    _ensure_packages(not args.no_install)
    priority = "default"
    if not args.no_priority:
        # On a shared machine (other test suites running) the measured processes should not queue behind
        # another job's: every process started from here inherits this niceness. Needs root; else skipped.
        try:
            os.setpriority(os.PRIO_PROCESS, 0, -10)
            priority = "nice -10"
        except OSError:
            priority = "default (raising it needs root)"
    settings = Settings(
        duration=args.duration,
        warmup=args.warmup,
        latency_duration=args.latency_duration,
        agent_seconds=args.agent_seconds,
        startup_runs=args.startup_runs,
        loadgen=args.loadgen,
        full_path_proxy_workers=args.full_path_proxy_workers,
        sections=sections,
    )
    if settings.loadgen == "auto" and not wrk_path():
        _log("note: wrk is not installed: the Python load generator (bench.pyload) is used")
    global _LOADAVG_AT_START
    _LOADAVG_AT_START = os.getloadavg()
    started = time.perf_counter()
    results = Suite(settings, _log).run()
    elapsed = time.perf_counter() - started

    raw = {
        "http": results.http,
        "valkey": results.valkey,
        "agents": results.agents,
        "launcher": results.launcher,
        "services": results.services,
        "noisy": results.noisy,
        "payload": results.payload,
        "notes": results.notes,
    }
    given = sys.argv[1:] if argv is None else argv
    command = "make bench" if not given else "python -m bench " + " ".join(given)
    derived = report.derive(raw)
    full = {
        "meta": {**_meta(command, elapsed, str(results.payload.get("valkey_version", "?"))), "priority": priority},
        "settings": {k: (sorted(v) if isinstance(v, frozenset) else v) for k, v in vars(settings).items()},
        "results": raw,
        "derived": derived,
        "targets": [t.as_json() for t in report.targets(raw, derived)],
    }
    print(report.render_text(full))
    # A partial run (--only) never replaces the full run's results or the page.
    out: Path = args.out or (RESULTS if not sections else RESULTS.with_name("partial.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(full, indent=2) + "\n")
    _log(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    if not args.no_doc and not sections:
        current = DOC.read_text() if DOC.exists() else _DOC_HEAD
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(report.splice(current, report.render_markdown(full)))
        _log(f"wrote {DOC.relative_to(REPO)}")
    return 0


_DOC_HEAD = """# Benchmarks

`make bench` measures everything below in one run and rewrites the generated part of this page.
"""


if __name__ == "__main__":
    sys.exit(main())
