"""The proxy as users start it (``python -m sessionmem_proxy``, dev identity mode) on a real
valkey-server, with small serving limits so hostile clients hit them quickly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sessionmem_core import env
from tests.support.processes import ServiceProcess, dev_proxy
from tests.support.valkey import ValkeyProcess

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
    process = dev_proxy(
        valkey.url,
        **{
            env.HEADER_TIMEOUT_SECONDS: str(HEAD_TIMEOUT_SECONDS),
            env.IDLE_TIMEOUT_SECONDS: str(HEAD_TIMEOUT_SECONDS),
            env.BODY_TIMEOUT_SECONDS: str(BODY_TIMEOUT_SECONDS),
            env.MAX_CONNECTIONS: str(MAX_IN_FLIGHT),
            # The export tests move hundreds of MiB for one agent: its transfer rate is not what they test
            # (tests/proxy/test_quotas.py and tests/adversarial/test_tenant_fairness.py are).
            env.QUOTA_BYTES_PER_SECOND: str(1 << 40),
            "SESSIONMEM_PROXY_WORKERS": "1",
        },
    )
    process.start()
    yield process
    process.stop()
