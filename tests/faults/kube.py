"""A control plane whose kube-apiserver can be restarted (the harness's KubeTestCluster cannot), and the
operator as the real process users run (``python -m sessionmem_operator``), for fault tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sessionmem_core import env
from tests.harness.apiserver import KubeTestCluster, ManagedProcess
from tests.support.processes import stop_process_group

PROXY_URL = "http://sessionmem-proxy.sessionmem.svc:8000"
AUDIENCE = "sessionmem-faults-audience"
LAUNCHER_IMAGE = "registry.example/sessionmem:faults"


class RestartableKubeCluster(KubeTestCluster):
    """KubeTestCluster plus ``restart_apiserver``: the same process arguments (port, certificates, etcd), so
    clients reconnect to the address they know. etcd keeps running, so nothing stored is lost."""

    def _process(self, name: str) -> ManagedProcess:
        return next(p for p in self.processes if p.name == name)

    def stop_apiserver(self, sig: int = signal.SIGKILL) -> None:
        proc = self._process("kube-apiserver")
        if proc.popen is not None and proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, sig)
            proc.popen.wait(timeout=30)
        proc.stop()  # closes its log; start() reopens it in append mode

    def start_apiserver(self, timeout: float = 60.0) -> float:
        """Start it again on its port; returns the seconds until /readyz answered 200."""
        proc = self._process("kube-apiserver")
        started = time.monotonic()
        proc.start()
        self._wait_http(proc, f"{self.server_url}/readyz", started + timeout, token=self.admin_token)
        return time.monotonic() - started


class OperatorProcess:
    """``python -m sessionmem_operator`` logged in through $KUBECONFIG, its output in a log file."""

    def __init__(self, cluster: KubeTestCluster) -> None:
        self.env = cluster.kubeconfig_env()
        self.env.update(
            {
                env.OPERATOR_PROXY_URL: PROXY_URL,
                env.OPERATOR_AUDIENCE: AUDIENCE,
                env.OPERATOR_LAUNCHER_IMAGE: LAUNCHER_IMAGE,
            }
        )
        self.log_path = Path(tempfile.mkstemp(prefix="sessionmem-operator-", suffix=".log")[1])
        # PROXY_URL names no proxy that runs: its health is not probed here, or every agent's MemoryReady
        # would say ProxyUnreachable (tests/operator/test_memory_health.py probes a real one).
        config_file = Path(tempfile.mkstemp(prefix="sessionmem-operator-", suffix=".yaml")[1])
        config_file.write_text("memoryHealthSeconds: 0\n", encoding="utf-8")
        self.env[env.OPERATOR_CONFIG_FILE] = str(config_file)
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        log.write(f"--- start {self.starts + 1}\n".encode())
        log.flush()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "sessionmem_operator"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.starts += 1

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self._proc is not None:
            stop_process_group(self._proc, sig, timeout=15)
        self._proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def apiserver_ready(cluster: KubeTestCluster) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        response = httpx.get(
            f"{cluster.server_url}/readyz",
            headers={"Authorization": f"Bearer {cluster.admin_token}"},
            verify=str(cluster.ca_path),
            timeout=2,
        )
        return response.status_code == 200
    return False
