"""A real kubectl for the integration tier: the same Kubernetes version as tools/envtest's API server,
built once (tools/e2e/build-binaries.sh kubectl) and cached per user."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tools" / "e2e" / "build-binaries.sh"
_lock = threading.Lock()
_path: Path | None = None


def kubectl_binary() -> Path:
    """The kubectl binary (built on first use: a few minutes). Never skips: a failed build fails the test."""
    global _path
    with _lock:
        if _path is None or not _path.exists():
            proc = subprocess.run(
                ["bash", str(BUILD_SCRIPT), "kubectl"], stdout=subprocess.PIPE, text=True, check=False
            )
            if proc.returncode != 0:
                raise RuntimeError(f"{BUILD_SCRIPT} kubectl failed with exit code {proc.returncode}")
            found = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
            _path = Path(found["KUBECTL"])
        return _path
