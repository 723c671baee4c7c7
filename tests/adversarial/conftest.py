"""The proxy as users start it (``python -m sessionmem_proxy``, dev identity mode) on a real
valkey-server, with small serving limits so hostile clients hit them quickly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sessionmem_core import env
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess, free_port

HEAD_TIMEOUT_SECONDS = 1.5
BODY_TIMEOUT_SECONDS = 1.5
MAX_IN_FLIGHT = 4


@pytest.fixture(scope="module")
def valkey() -> Iterator[ValkeyProcess]:
    server = ValkeyProcess()
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def proxy(valkey: ValkeyProcess) -> Iterator[ServiceProcess]:
    port = free_port()
    process = ServiceProcess(
        "sessionmem_proxy",
        {
            env.VALKEY_URL: valkey.url,
            env.AUTH_MODE: "dev",
            env.PROXY_HOST: "127.0.0.1",
            env.PROXY_PORT: str(port),
            env.HEADER_TIMEOUT_SECONDS: str(HEAD_TIMEOUT_SECONDS),
            env.IDLE_TIMEOUT_SECONDS: str(HEAD_TIMEOUT_SECONDS),
            env.BODY_TIMEOUT_SECONDS: str(BODY_TIMEOUT_SECONDS),
            env.MAX_CONNECTIONS: str(MAX_IN_FLIGHT),
            "SESSIONMEM_PROXY_WORKERS": "1",
        },
        port,
    )
    process.start()
    yield process
    process.stop()
