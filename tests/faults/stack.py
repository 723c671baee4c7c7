"""The data path as separate real processes, for fault injection: Valkey (optionally with AOF), the proxy
(dev identity), the demo agent and the launcher, each on its own fixed loopback port so it can be killed
and restarted where its clients expect it.

Used by the fault tests and by ``bench.soak``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from sessionmem_core import env
from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner, session_key
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess, free_port

NAMESPACE = "team-a"
AGENT = "support-agent"
OWNER = Owner(namespace=NAMESPACE, agent=AGENT)
TOKEN = dev_token(NAMESPACE, AGENT)
AUTH = {"authorization": f"Bearer {TOKEN}"}
# Loads stay well under this, so trimming never removes an acknowledged entry.
LOAD_CAP = "10000"

AOF_ALWAYS = ("--appendonly", "yes", "--appendfsync", "always")
AOF_EVERYSEC = ("--appendonly", "yes", "--appendfsync", "everysec")


def conversation_key(conversation_id: str) -> str:
    return session_key(OWNER, conversation_id)


def proxy_process(valkey_url: str, port: int | None = None, **extra: str) -> ServiceProcess:
    port = port or free_port()
    return ServiceProcess(
        "sessionmem_proxy",
        {
            env.VALKEY_URL: valkey_url,
            env.AUTH_MODE: "dev",
            env.PROXY_HOST: "127.0.0.1",
            env.PROXY_PORT: str(port),
            # Load tests drive one agent far past a tenant's default rate; tests/proxy/test_quotas.py covers it.
            env.QUOTA_REQUESTS_PER_SECOND: "1000000",
            env.QUOTA_BURST: "1000000",
            env.QUOTA_BYTES_PER_SECOND: str(1 << 40),
            **extra,
        },
        port,
        health_path="/healthz",
    )


def agent_process(port: int | None = None) -> ServiceProcess:
    """The demo agent under uvicorn (which takes its app and options from UVICORN_* variables)."""
    port = port or free_port()
    return ServiceProcess(
        "uvicorn",
        {
            "UVICORN_APP": "sessionmem_demo.agent:app",
            "UVICORN_HOST": "127.0.0.1",
            "UVICORN_PORT": str(port),
            "UVICORN_LOG_LEVEL": "warning",
        },
        port,
        health_path="/healthz",
    )


def launcher_process(proxy_url: str, agent_port: int, token_file: Path, port: int | None = None) -> ServiceProcess:
    serve_port = port or free_port()
    return ServiceProcess(
        "sessionmem_launcher",
        {
            env.PROXY_URL: proxy_url,
            env.TOKEN_PATH: str(token_file),
            env.NAMESPACE: NAMESPACE,
            env.AGENT: AGENT,
            env.LAUNCHER_PORT: str(free_port()),
            env.SERVE_PORT: str(serve_port),
            env.AGENT_PORT: str(agent_port),
            env.CAP: LOAD_CAP,
            env.PROXY_TIMEOUT_SECONDS: "1.5",
        },
        serve_port,
        health_path="/healthz",
    )


@dataclass
class Stack:
    valkey: ValkeyProcess
    proxy: ServiceProcess
    agent: ServiceProcess | None = None
    launcher: ServiceProcess | None = None
    token_file: Path | None = None
    restarts: dict[str, float] = field(default_factory=dict)

    @property
    def memory_port(self) -> int:
        assert self.launcher is not None
        return int(self.launcher.env[env.LAUNCHER_PORT])

    def kill_valkey_and_restart(self, down_seconds: float) -> float:
        """SIGKILL Valkey, wait, start it again on its port; returns when it answers (time.monotonic())."""
        self.valkey.kill()
        time.sleep(down_seconds)
        self.valkey.start()
        return time.monotonic()

    def kill_proxy_and_restart(self, down_seconds: float) -> float:
        self.proxy.stop(signal.SIGKILL)
        time.sleep(down_seconds)
        self.proxy.start()
        return time.monotonic()

    def pause_valkey(self, seconds: float) -> float:
        """SIGSTOP Valkey for ``seconds`` (a stall: connections stay open, nothing answers), then SIGCONT."""
        assert self.valkey._proc is not None
        pid = self.valkey._proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
        return time.monotonic()

    def read_all(self, conversation_id: str) -> list[bytes]:
        return self.valkey.client().lrange(conversation_key(conversation_id), 0, -1)

    def close(self) -> None:
        for proc in (self.launcher, self.agent, self.proxy):
            if proc is not None:
                proc.stop()
        self.valkey.close()
        if self.token_file is not None:
            self.token_file.unlink(missing_ok=True)


@contextlib.contextmanager
def running_stack(valkey_args: tuple[str, ...] = AOF_ALWAYS, *, with_launcher: bool = False) -> Iterator[Stack]:
    valkey = ValkeyProcess(extra_args=valkey_args)
    valkey.start()
    stack = Stack(valkey=valkey, proxy=proxy_process(valkey.url))
    try:
        stack.proxy.start()
        if with_launcher:
            fd, name = tempfile.mkstemp(prefix="sessionmem-token-")
            os.close(fd)
            stack.token_file = Path(name)
            stack.token_file.write_text(TOKEN)
            stack.agent = agent_process()
            stack.agent.start()
            stack.launcher = launcher_process(stack.proxy.base_url, stack.agent.port, stack.token_file)
            stack.launcher.start()
        yield stack
    finally:
        stack.close()


def wait_ready(url: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout}s")
