"""A large export is paged: two at once of a 500-entry x 256 KiB conversation (125 MiB each), each
page asked for as the one before arrives, leave the proxy worker's peak memory far below the size of
one export (how many pages of an agent are read at once is tests/proxy/test_quotas.py), and a page its
client stops reading is cut off instead of holding its connection forever."""

from __future__ import annotations

import threading
import time
from typing import cast

import httpx
import orjson
import pytest

from sessionmem_core import api, env
from sessionmem_proxy.admission import STREAMS_PER_AGENT
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


def _export_pages(client: httpx.Client, path: str) -> list[dict[str, object]]:
    """Every page of one export, following ``nextOffset`` from the start."""
    pages: list[dict[str, object]] = []
    offset: object = 0
    while offset is not None:
        answer = client.get(path, params={api.OFFSET_PARAM: str(offset)})
        assert answer.status_code == 200, answer.text
        pages.append(orjson.loads(answer.content))
        offset = pages[-1]["nextOffset"]
    return pages


def test_concurrent_exports_of_a_huge_conversation_keep_the_worker_bounded(proxy: ServiceProcess, huge: str) -> None:
    worker = worker_pid(proxy.pid)
    baseline = memory_kib(worker, "VmHWM")
    exported: list[list[dict[str, object]]] = []
    errors: list[BaseException] = []

    def export() -> None:
        try:
            with httpx.Client(base_url=proxy.base_url, headers=AUTH, timeout=60) as client:
                exported.append(_export_pages(client, huge))
        except BaseException as exc:  # reported by the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=export) for _ in range(STREAMS_PER_AGENT)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert len(exported) == STREAMS_PER_AGENT
    for pages in exported:
        entries = [entry for page in pages for entry in cast(list[object], page["entries"])]
        assert len(entries) == ENTRIES and len(pages) > 1
        assert {page["version"] for page in pages} == {-(-ENTRIES // PER_APPEND)}
    growth = memory_kib(worker, "VmHWM") - baseline
    assert growth < MAX_GROWTH_KIB, f"worker peak memory grew {growth} KiB during the exports"


def test_an_export_page_nobody_reads_is_cut_off_after_the_idle_timeout(proxy: ServiceProcess, huge: str) -> None:
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
