"""``python -m sessionmem_launcher``'s process-wide settings, checked in a fresh interpreter (they change
the garbage collector of the whole process, which a test must not do to the test runner's)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_cycles_left_by_requests_get_full_collections_despite_many_long_lived_objects() -> None:
    # Start-up leaves tens of thousands of long-lived objects; with CPython's defaults a full collection
    # then waits until a quarter as many have been promoted, and cycles that outlived their request
    # (held in flight across a young collection) pile up until then.
    code = textwrap.dedent(
        """
        import gc
        from collections import Counter, deque
        from sessionmem_launcher.__main__ import bound_garbage_lifetime

        start_up = [{"n": [n]} for n in range(15000)]
        bound_garbage_lifetime()
        runs = Counter()
        gc.callbacks.append(lambda phase, info: phase == "start" and runs.update([info["generation"]]))
        in_flight = deque(maxlen=64)
        for _ in range(100000):
            cycle = [{}]
            cycle[0]["self"] = cycle
            in_flight.append(cycle)
        print(runs[0], runs[2], gc.get_freeze_count() >= len(start_up))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    young, full, frozen = result.stdout.split()
    assert frozen == "True", "start-up's objects are out of every collection"
    assert int(full) * 10 >= int(young), f"{full} full collections for {young} young ones"


def _launcher(*args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONMEM_")} | (environ or {})
    return subprocess.run(
        [sys.executable, "-m", "sessionmem_launcher", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_help_prints_usage_and_exits_without_starting() -> None:
    # Ports that are surely free and a proxy URL: were it to start, it would serve until killed (the timeout).
    result = _launcher("--help", environ={"SESSIONMEM_PROXY_URL": "http://127.0.0.1:9"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m sessionmem_launcher")
    assert "SESSIONMEM_PROXY_URL" in result.stdout


def test_an_unknown_argument_is_refused() -> None:
    result = _launcher("--serve-forever")
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr


def test_without_a_proxy_url_the_launcher_refuses_to_start_and_says_why() -> None:
    # A backend address (the old direct mode) changes nothing: the launcher never talks to Valkey itself.
    result = _launcher(environ={"SESSIONMEM_BACKEND_ADDR": "127.0.0.1:6379", "SESSIONMEM_LAUNCHER_PORT": "0"})
    assert result.returncode == 1
    assert "SESSIONMEM_PROXY_URL is not set" in result.stderr
