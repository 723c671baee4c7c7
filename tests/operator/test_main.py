"""``python -m sessionmem_operator --help`` answers and exits without starting the operator."""

from __future__ import annotations

import os
import subprocess
import sys

from sessionmem_core import env


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # No cluster to reach: a process that tried to start would fail or hang (and hit the timeout).
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "SESSIONMEM_"))}
    environ["KUBECONFIG"] = os.devnull
    return subprocess.run(
        [sys.executable, "-m", "sessionmem_operator", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
        check=False,
    )


def test_help_prints_usage_and_exits_zero() -> None:
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m sessionmem_operator"), proc.stdout
    assert env.OPERATOR_PROXY_URL in proc.stdout
    assert "kopf" not in proc.stderr.lower(), proc.stderr


def test_an_unknown_argument_is_refused_before_starting() -> None:
    proc = _run("--no-such-flag")
    assert proc.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in proc.stderr, proc.stderr
