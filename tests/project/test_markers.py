"""The markers that name what a test needs are set from what it really uses (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _collected(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    return {line.split("[")[0] for line in done.stdout.splitlines() if "::" in line}


def test_markers_follow_the_fixtures_and_folders_a_test_uses() -> None:
    files = ["tests/core/test_capability.py", "tests/proxy/test_proxy.py", "tests/proxy/test_admin_authority.py",
             "tests/adversarial/test_limits.py"]  # fmt: skip
    valkey = _collected("-m", "valkey", *files)
    kube = _collected("-m", "kube", *files)
    faults = _collected("-m", "faults", *files)
    assert any(t.startswith("tests/proxy/test_proxy.py::") for t in valkey)
    assert any(t.startswith("tests/adversarial/test_limits.py::") for t in valkey)
    assert not any(t.startswith("tests/core/test_capability.py::") for t in valkey | kube | faults)
    assert kube and all(t.startswith("tests/proxy/test_admin_authority.py::") for t in kube)
    assert faults and all(t.startswith("tests/adversarial/") for t in faults)
