"""``python -m sessionmem_operator --help`` answers and exits without starting the operator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sessionmem_core import env


def _run(*args: str, kubeconfig: str = os.devnull, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # No cluster to reach: a process that tried to start would fail or hang (and hit the timeout).
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "SESSIONMEM_"))}
    environ["KUBECONFIG"] = kubeconfig
    return subprocess.run(
        [sys.executable, "-m", "sessionmem_operator", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=timeout,
        check=False,
    )


def test_help_prints_usage_and_exits_zero() -> None:
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m sessionmem_operator"), proc.stdout
    operator_variables = [v for k, v in vars(env).items() if k.startswith("OPERATOR_") and isinstance(v, str)]
    assert env.OPERATOR_NAMESPACE in operator_variables
    for variable in operator_variables:
        assert variable in proc.stdout
    assert "kopf" not in proc.stderr.lower(), proc.stderr


def test_an_unknown_argument_is_refused_before_starting() -> None:
    proc = _run("--no-such-flag")
    assert proc.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in proc.stderr, proc.stderr


@pytest.mark.parametrize("kubeconfig", ["missing", "empty"])
def test_without_credentials_it_exits_saying_what_to_set(tmp_path: Path, kubeconfig: str) -> None:
    # Within seconds: kopf's login would otherwise be retried every minute, for ever.
    path = tmp_path / "kubeconfig"
    if kubeconfig == "empty":
        path.write_text("")
    proc = _run(kubeconfig=str(path), timeout=30)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("sessionmem-operator: no Kubernetes credentials") and str(path) in line
    assert "set KUBECONFIG" in line
