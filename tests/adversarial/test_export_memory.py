"""A large export streams page by page: three at once of a 500-entry x 256 KiB conversation (125 MiB
each) leave the proxy worker's peak memory far below the size of one export."""

from __future__ import annotations

import threading

import httpx
import orjson

from sessionmem_core import env
from tests.adversarial.rawhttp import TOKEN, memory_kib, worker_pid
from tests.support.processes import ServiceProcess

ENTRIES = 500
PER_APPEND = 3
# Peak growth allowed while the exports run: a few pages each, nowhere near one whole export.
MAX_GROWTH_KIB = 48 * 1024


def test_three_concurrent_exports_of_a_huge_conversation_keep_the_worker_bounded(proxy: ServiceProcess) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    content = "x" * env.MAX_CONTENT_CHARS
    with httpx.Client(base_url=proxy.base_url, headers=auth, timeout=30) as client:
        for start in range(0, ENTRIES, PER_APPEND):
            entries = [{"role": "user", "content": content} for _ in range(min(PER_APPEND, ENTRIES - start))]
            answer = client.post("/v1/conversations/huge/entries", json={"entries": entries})
            assert answer.status_code == 200, answer.text
    worker = worker_pid(proxy.pid)
    baseline = memory_kib(worker, "VmHWM")
    sizes: list[int] = []
    first: list[bytes] = []
    errors: list[BaseException] = []

    def export(keep: bool) -> None:
        try:
            with (
                httpx.Client(base_url=proxy.base_url, headers=auth, timeout=60) as client,
                client.stream("GET", "/v1/conversations/huge/export") as response,
            ):
                assert response.status_code == 200
                size = 0
                parts = []
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if keep:
                        parts.append(chunk)
                sizes.append(size)
                if keep:
                    first.append(b"".join(parts))
        except BaseException as exc:  # reported by the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=export, args=(i == 0,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert len(sizes) == 3 and min(sizes) > ENTRIES * env.MAX_CONTENT_CHARS
    document = orjson.loads(first[0])
    assert len(document["entries"]) == ENTRIES and document["version"] == -(-ENTRIES // PER_APPEND)
    growth = memory_kib(worker, "VmHWM") - baseline
    assert growth < MAX_GROWTH_KIB, f"worker peak memory grew {growth} KiB during three exports"
