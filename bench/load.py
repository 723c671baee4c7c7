"""HTTP load against a local server, by wrk (preferred) or by bench.pyload, with the CPU every side used.

wrk (C, epoll, one thread) costs the 2-core machine far less CPU per request than any Python client, so
it leaves the cores to the servers under test; bench.pyload is the fallback where wrk is not installed.
Every run is a warm-up run (discarded) followed by the measured run, both closed-loop (a connection sends
its next request when the previous answer is complete), bounded in time. While the measured run goes,
the CPU time of each watched process tree, of the load generator and of the whole machine is recorded,
so a result shows whether the server was the bottleneck (and how busy the machine was with other work).
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.procs import REPO, cpu_seconds, machine_busy_seconds


@dataclass(frozen=True)
class Load:
    port: int
    paths: tuple[str, ...]
    method: str = "GET"
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    connections: int = 1
    duration: float = 3.0
    warmup: float = 1.0


@dataclass
class LoadResult:
    tool: str
    connections: int
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    errors: int
    # Cores used during the measured run: per watched process tree, by the load generator, by the machine.
    cpu_cores: dict[str, float] = field(default_factory=dict)
    # CPU microseconds per answered request, per watched process tree and the load generator: unlike
    # throughput, this barely moves when another job competes for the cores.
    cpu_us_per_request: dict[str, float] = field(default_factory=dict)
    # For a tree of several processes (uvicorn's supervisor and its workers): cores by process, busiest
    # first, which shows whether the connections were spread over the workers.
    cpu_cores_by_process: dict[str, list[float]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def wrk_path() -> str | None:
    return shutil.which("wrk")


def _lua_string(value: str) -> str:
    level = "=" * 4
    assert f"]{level}]" not in value
    return f"[{level}[{value}]{level}]"


def _wrk_script(load: Load) -> str:
    paths = ", ".join(_lua_string(p) for p in load.paths)
    headers = ", ".join(f"[ {_lua_string(k)} ] = {_lua_string(v)}" for k, v in load.headers)
    body = _lua_string(load.body.decode()) if load.body else "nil"
    return f"""
local paths = {{ {paths} }}
local method = {_lua_string(load.method)}
local headers = {{ {headers} }}
local body = {body}
local reqs = {{}}
local n = 0
function init(args)
  for k, p in ipairs(paths) do reqs[k] = wrk.format(method, p, headers, body) end
end
function request()
  n = n + 1
  if n > #reqs then n = 1 end
  return reqs[n]
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCHJSON {{"requests":%d,"duration_us":%d,"errors":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.3f}}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
"""


def _run_wrk(load: Load, seconds: float) -> dict[str, Any]:
    wrk = wrk_path()
    assert wrk is not None
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_wrk_script(load))
    try:
        duration = max(1, round(seconds))
        argv = [wrk, "-t1", f"-c{load.connections}", f"-d{duration}s", "--timeout", "10s", "-s", script.name]
        argv.append(f"http://127.0.0.1:{load.port}{load.paths[0]}")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 30, check=False)
    finally:
        Path(script.name).unlink()
    for line in done.stdout.splitlines():
        if line.startswith("BENCHJSON "):
            raw = json.loads(line.removeprefix("BENCHJSON "))
            secs = raw["duration_us"] / 1e6
            return {
                "requests": raw["requests"],
                "seconds": secs,
                "errors": raw["errors"],
                "p50_ms": raw["p50_us"] / 1e3,
                "p90_ms": raw["p90_us"] / 1e3,
                "p99_ms": raw["p99_us"] / 1e3,
                "mean_ms": raw["mean_us"] / 1e3,
            }
    raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-1000:]} {done.stderr[-1000:]}")


def _run_pyload(load: Load, warmup: float, seconds: float) -> dict[str, Any]:
    spec = {
        "port": load.port,
        "paths": list(load.paths),
        "method": load.method,
        "body": load.body.decode(),
        "headers": [list(h) for h in load.headers],
        "connections": load.connections,
        "warmup": warmup,
        "duration": seconds,
    }
    done = subprocess.run(
        [sys.executable, "-m", "bench.pyload", json.dumps(spec)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=warmup + seconds + 60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.pyload failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_load(load: Load, watch: Mapping[str, Sequence[int]], tool: str = "auto") -> LoadResult:
    """Warm up, then measure ``load``; ``watch`` names the process trees whose CPU use is recorded."""
    chosen = ("wrk" if wrk_path() else "pyload") if tool == "auto" else tool
    if chosen == "wrk" and load.warmup > 0:
        _run_wrk(load, load.warmup)
    before = {name: cpu_seconds(pids) for name, pids in watch.items()}
    before_each = {(name, pid): cpu_seconds([pid]) for name, pids in watch.items() if len(pids) > 1 for pid in pids}
    machine_before, children_before, wall_before = machine_busy_seconds(), _children_cpu(), time.perf_counter()
    # bench.pyload warms up inside its own run (the warm-up's answers are not counted).
    raw = _run_wrk(load, load.duration) if chosen == "wrk" else _run_pyload(load, load.warmup, load.duration)
    wall = time.perf_counter() - wall_before
    cores = {name: (cpu_seconds(pids) - before[name]) / wall for name, pids in watch.items()}
    by_process: dict[str, list[float]] = {}
    for (name, pid), spent in before_each.items():
        by_process.setdefault(name, []).append(round((cpu_seconds([pid]) - spent) / wall, 3))
    cores["loadgen"] = (_children_cpu() - children_before) / wall
    cores["machine"] = (machine_busy_seconds() - machine_before) / wall
    cores["other"] = max(0.0, cores["machine"] - sum(v for k, v in cores.items() if k != "machine"))
    requests = int(raw["requests"])
    seconds = float(raw["seconds"])
    rps = requests / seconds if seconds else 0.0
    per_request = {k: round(v / rps * 1e6, 1) for k, v in cores.items() if k not in ("machine", "other") and rps}
    return LoadResult(
        tool=chosen,
        connections=load.connections,
        requests=requests,
        seconds=seconds,
        rps=rps,
        p50_ms=float(raw["p50_ms"]),
        p90_ms=float(raw["p90_ms"]),
        p99_ms=float(raw["p99_ms"]),
        mean_ms=float(raw["mean_ms"]),
        errors=int(raw["errors"]),
        cpu_cores={k: round(v, 3) for k, v in cores.items()},
        cpu_us_per_request=per_request,
        cpu_cores_by_process={k: sorted(v, reverse=True) for k, v in by_process.items()},
    )
