"""The proxy at its file-descriptor limit, as a container runtime sets it: more clients hold connections
open than the worker may have files. The worker must not spin on accepts it cannot complete, and must
serve again once the crowd leaves."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sessionmem_core import env
from tests.adversarial.rawhttp import connect, worker_pid
from tests.support.processes import ServiceProcess, dev_proxy
from tests.support.valkey import ValkeyProcess

DESCRIPTORS = 256
CROWD = 2 * DESCRIPTORS
MEASURE_SECONDS = 2.0
# A worker that waits for its connections to end takes no measurable CPU (0.00 CPU-s per second measured
# with the cap); a spinning accept loop takes a third of a core or more (0.33 on a loaded two-core machine,
# 0.6-1.0 on an idle one, measured before the cap).
MAX_CPU_SHARE = 0.1


@pytest.fixture(scope="module")
def crowded_proxy(valkey: ValkeyProcess) -> Iterator[ServiceProcess]:
    process = dev_proxy(
        valkey.url,
        **{
            # Held connections stay open for the whole test: no head timer closes them meanwhile.
            env.HEADER_TIMEOUT_SECONDS: "60",
            env.IDLE_TIMEOUT_SECONDS: "60",
            "SESSIONMEM_PROXY_WORKERS": "1",
        },
    )
    process.descriptor_limit = DESCRIPTORS
    process.start()
    yield process
    process.stop()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in clock ticks (USER_HZ)


def test_a_worker_at_its_descriptor_limit_does_not_spin_and_serves_again(crowded_proxy: ServiceProcess) -> None:
    worker = worker_pid(crowded_proxy.pid)
    crowd: list[socket.socket] = []
    try:
        for _ in range(CROWD):
            with contextlib.suppress(OSError):
                crowd.append(connect(crowded_proxy.port, timeout=2))
        time.sleep(0.5)  # the worker takes what it will
        before = _cpu_seconds(worker)
        time.sleep(MEASURE_SECONDS)
        share = (_cpu_seconds(worker) - before) / MEASURE_SECONDS
    finally:
        for sock in crowd:
            sock.close()
    assert len(crowd) > DESCRIPTORS, "the crowd outnumbered the worker's descriptors"
    assert share < MAX_CPU_SHARE, f"the worker spent {share:.2f} CPU-s/s while at its descriptor limit"
    deadline = time.monotonic() + 10
    served = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            served = httpx.get(crowded_proxy.health_url, timeout=2).status_code
            if served == 200:
                break
        time.sleep(0.1)
    assert served == 200, "served again once the crowd left"
