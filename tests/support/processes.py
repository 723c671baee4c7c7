"""The proxy and the launcher as the real processes users run, for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import httpx


def stop_process_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Signal a child started with ``start_new_session`` and everything it started; escalate to SIGKILL
    when it does not exit in time, so no test leaves a server behind."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class ServiceProcess:
    def __init__(
        self,
        module: str,
        env: Mapping[str, str],
        port: int,
        health_path: str = "/healthz",
        descriptor_limit: int | None = None,
    ) -> None:
        """``descriptor_limit``: the process's open-file limit, soft and hard (as a container runtime sets
        it), instead of the one it would inherit."""
        self.module = module
        self.descriptor_limit = descriptor_limit
        self.env = {**os.environ, **env}
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.health_url = self.base_url + health_path
        self.log_path = Path(tempfile.mkstemp(prefix=f"{module}-", suffix=".log")[1])
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        self._proc = subprocess.Popen(
            [sys.executable, "-m", self.module],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if self.descriptor_limit is None else self._limit_descriptors,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{self.module} exited:\n{self.log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.health_url, timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"{self.module} did not become healthy:\n{self.log_path.read_text()[-3000:]}")

    def _limit_descriptors(self) -> None:
        assert self.descriptor_limit is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.descriptor_limit, self.descriptor_limit))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self._proc is not None:
            stop_process_group(self._proc, sig)
        self._proc = None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid


def dev_proxy(valkey_url: str, **extra: str) -> ServiceProcess:
    """The proxy as users start it (``python -m sessionmem_proxy``), in the explicit dev identity mode, on a
    free loopback port, with ``extra`` environment (sessionmem_core.env names); not started yet."""
    from sessionmem_core import env
    from tests.support.valkey import free_port

    port = free_port()
    variables = {
        env.VALKEY_URL: valkey_url,
        env.AUTH_MODE: "dev",
        env.PROXY_HOST: "127.0.0.1",
        env.PROXY_PORT: str(port),
        **extra,
    }
    return ServiceProcess("sessionmem_proxy", variables, port)
