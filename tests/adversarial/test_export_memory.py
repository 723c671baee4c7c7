"""A large export streams page by page: two at once of a 500-entry x 256 KiB conversation (125 MiB
each) leave the proxy worker's peak memory far below the size of one export, a third of the same agent
meanwhile is refused (quotas.STREAMS_PER_AGENT), and an export its client stops reading is cut off
instead of holding its request slot forever."""

from __future__ import annotations

import threading
import time

import httpx
import orjson
import pytest

from sessionmem_core import env
from sessionmem_proxy.quotas import STREAMS_PER_AGENT
from tests.adversarial.conftest import HEAD_TIMEOUT_SECONDS
from tests.adversarial.rawhttp import TOKEN, connect, memory_kib, request, worker_pid
from tests.support.processes import ServiceProcess

ENTRIES = 500
PER_APPEND = 3
# Peak growth allowed while the exports run: a few pages each, nowhere near one whole export.
MAX_GROWTH_KIB = 48 * 1024
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def huge(proxy: ServiceProcess) -> str:
    """A conversation of ENTRIES entries of the largest size, written through the proxy."""
    content = "x" * env.MAX_CONTENT_CHARS
    with httpx.Client(base_url=proxy.base_url, headers=AUTH, timeout=30) as client:
        for start in range(0, ENTRIES, PER_APPEND):
            entries = [{"role": "user", "content": content} for _ in range(min(PER_APPEND, ENTRIES - start))]
            answer = client.post("/v1/conversations/huge/entries", json={"entries": entries})
            assert answer.status_code == 200, answer.text
    return "/v1/conversations/huge/export"


def test_concurrent_exports_of_a_huge_conversation_keep_the_worker_bounded(proxy: ServiceProcess, huge: str) -> None:
    worker = worker_pid(proxy.pid)
    baseline = memory_kib(worker, "VmHWM")
    sizes: list[int] = []
    first: list[bytes] = []
    errors: list[BaseException] = []
    started = [threading.Event() for _ in range(STREAMS_PER_AGENT)]
    go_on = threading.Event()

    def export(index: int) -> None:
        try:
            with (
                httpx.Client(base_url=proxy.base_url, headers=AUTH, timeout=60) as client,
                client.stream("GET", huge) as response,
            ):
                assert response.status_code == 200
                size = 0
                parts = []
                for chunk in response.iter_bytes():
                    if not started[index].is_set():
                        started[index].set()
                        go_on.wait(30)  # every export is under way before any finishes
                    size += len(chunk)
                    if index == 0:
                        parts.append(chunk)
                sizes.append(size)
                if index == 0:
                    first.append(b"".join(parts))
        except BaseException as exc:  # reported by the test thread below
            errors.append(exc)
            started[index].set()

    threads = [threading.Thread(target=export, args=(i,)) for i in range(STREAMS_PER_AGENT)]
    for thread in threads:
        thread.start()
    for event in started:
        assert event.wait(30)
    with httpx.Client(base_url=proxy.base_url, headers=AUTH, timeout=30) as client:
        one_more = client.get(huge)
    assert one_more.status_code == 429 and one_more.json()["error"]["type"] == "rate_limited"
    go_on.set()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert len(sizes) == STREAMS_PER_AGENT and min(sizes) > ENTRIES * env.MAX_CONTENT_CHARS
    document = orjson.loads(first[0])
    assert len(document["entries"]) == ENTRIES and document["version"] == -(-ENTRIES // PER_APPEND)
    growth = memory_kib(worker, "VmHWM") - baseline
    assert growth < MAX_GROWTH_KIB, f"worker peak memory grew {growth} KiB during the exports"
    with httpx.Client(base_url=proxy.base_url, headers=AUTH, timeout=60) as client:
        assert client.get(huge).status_code == 200  # the slots were given back


def test_an_export_nobody_reads_is_cut_off_after_the_idle_timeout(proxy: ServiceProcess, huge: str) -> None:
    whole = ENTRIES * env.MAX_CONTENT_CHARS
    with connect(proxy.port) as sock:
        sock.sendall(request("GET", huge))
        time.sleep(HEAD_TIMEOUT_SECONDS + 1.0)  # the client takes nothing for longer than the idle timeout
        received = 0
        deadline = time.monotonic() + 10
        sock.settimeout(10)
        while chunk := sock.recv(1 << 20):
            received += len(chunk)
            assert time.monotonic() < deadline, "the stalled export was not cut off"
    assert 0 < received < whole, f"{received} of {whole} bytes: the export should have been cut off"
    with httpx.Client(base_url=proxy.base_url, headers=AUTH, timeout=30) as client:
        assert client.get("/healthz").status_code == 200
