"""A greedy agent that stores large entries and reads them back: its reads and searches are bounded by
bytes, so they cost the proxy worker and Valkey a bounded amount of memory whatever the conversation's
size, and a search is charged to the agent's transfer rate as it reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from sessionmem_core import env
from tests.adversarial.rawhttp import TOKEN, memory_kib, worker_pid
from tests.support.processes import ServiceProcess, dev_proxy
from tests.support.valkey import ValkeyProcess

MIB = 1024 * 1024
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# ~720 KB stored per entry: 240,000 three-byte characters, under the 256 Ki-character content limit and
# the 1 MiB body limit.
BIG_CONTENT = "語" * 240_000
ENTRIES = 120  # ~86 MB in one conversation
CONVERSATION = "hoard"
# What one read or search may add to the proxy worker's and Valkey's peak memory, with four of them at
# once: the answers are bounded to 4 MiB (READ_ANSWER_BYTES) and a search holds one ~1 MiB page.
MAX_GROWTH_MIB = 64
# The rate-limited proxy: a 2 MiB burst (two maximal bodies) and 1 MiB/s.
RATE = MIB
PACED_ENTRIES = 6


def _proxy(valkey: ValkeyProcess, bytes_per_second: int) -> ServiceProcess:
    return dev_proxy(
        valkey.url,
        **{
            env.QUOTA_BYTES_PER_SECOND: str(bytes_per_second),
            env.QUOTA_REQUESTS_PER_SECOND: "100000",
            env.QUOTA_BURST: "100000",
            "SESSIONMEM_PROXY_WORKERS": "1",
        },
    )


@pytest.fixture(scope="module")
def proxy(valkey: ValkeyProcess) -> Iterator[ServiceProcess]:
    process = _proxy(valkey, 1 << 40)
    process.start()
    yield process
    process.stop()


def _store(proxy: ServiceProcess, conversation: str, count: int) -> None:
    with httpx.Client(base_url=proxy.base_url, headers=AUTH, timeout=30) as client:
        for i in range(count):
            content = ("needle " if i % 10 == 0 else "") + BIG_CONTENT
            body = orjson.dumps({"entries": [{"role": "user", "content": content, "id": f"e{i}"}]})
            answer = client.post(
                f"/v1/conversations/{conversation}/entries", content=body, headers={"content-type": "application/json"}
            )
            assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def stored(proxy: ServiceProcess) -> None:
    """Both tests' conversations, written before either searches: a search's ranking CPU is charged to the
    agent's transfer rate (``Quotas.charge_cpu``), so after one the agent may be refused for seconds, even
    at this proxy's unlimited byte rate, and a later write of the same agent with it."""
    _store(proxy, CONVERSATION, ENTRIES)
    _store(proxy, "paced", PACED_ENTRIES)


@pytest.mark.usefixtures("stored")
def test_big_reads_and_searches_keep_the_worker_and_valkey_bounded(
    proxy: ServiceProcess, valkey: ValkeyProcess
) -> None:
    worker = worker_pid(proxy.pid)
    worker_before, valkey_before = memory_kib(worker, "VmHWM"), memory_kib(valkey.pid, "VmHWM")
    answers: list[httpx.Response] = []

    def call(target: str) -> None:
        # One agent reads at most two big answers at once in a worker (its share); the others are told to
        # come back, and do, as told.
        with httpx.Client(base_url=proxy.base_url, headers=AUTH, timeout=60) as client:
            answer = client.get(target)
            while answer.status_code == 429:
                time.sleep(int(answer.headers["retry-after"]))
                answer = client.get(target)
            answers.append(answer)

    targets = [f"/v1/conversations/{CONVERSATION}/entries?limit=500"] * 3
    targets.append(f"/v1/conversations/{CONVERSATION}/search?q=needle&limit=50")
    threads = [threading.Thread(target=call, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    worker_growth = (memory_kib(worker, "VmHWM") - worker_before) / 1024
    valkey_growth = (memory_kib(valkey.pid, "VmHWM") - valkey_before) / 1024

    assert sorted(a.status_code for a in answers) == [200] * 4, [a.text[:200] for a in answers]
    for answer in answers:
        document = answer.json()
        found = document.get("entries", document.get("matches"))
        assert found, "at least the newest entry (or the best match) is answered"
        assert len(answer.content) <= 5 * MIB, f"an answer of {len(answer.content)} bytes"
        if "entries" in document:
            assert [e["id"] for e in found] == [f"e{i}" for i in range(ENTRIES - len(found), ENTRIES)]
    assert worker_growth < MAX_GROWTH_MIB, f"the proxy worker's peak grew {worker_growth:.0f} MiB"
    assert valkey_growth < MAX_GROWTH_MIB, f"Valkey's peak grew {valkey_growth:.0f} MiB"


@pytest.mark.usefixtures("stored")
def test_a_search_is_charged_to_the_agents_transfer_rate_as_it_reads(valkey: ValkeyProcess) -> None:
    """Written through an unlimited proxy, searched through one at 1 MiB/s with a 2 MiB burst: reading
    ~4.3 MB must take at least the time the rate gives for what exceeds the burst. A slower machine only
    makes it longer."""
    limited = _proxy(valkey, RATE)
    limited.start()
    try:
        with httpx.Client(base_url=limited.base_url, headers=AUTH, timeout=60) as client:
            started = time.monotonic()
            answer = client.get("/v1/conversations/paced/search?q=needle&limit=5")
            took = time.monotonic() - started
    finally:
        limited.stop()
    assert answer.status_code == 200 and answer.json()["matches"], answer.text[:200]
    read = PACED_ENTRIES * len(BIG_CONTENT.encode())
    owed = (read - 2 * env.MAX_BODY_BYTES) / RATE
    assert took >= 0.8 * owed, f"a search reading {read} bytes took {took:.2f} s: not paced to the rate"
