"""A greedy tenant that floods the real proxy process (as users start it, one worker, on a real
valkey-server) with its own credentials: its big reads beyond its share of a worker are typed 429s while
another agent's big read is served, and its refusals, once it keeps asking before the Retry-After it was
given, are answered only when that has passed, outside the worker's request slots, while another agent is
served."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import orjson
import pytest

from sessionmem_core import env
from sessionmem_core.devauth import dev_token
from tests.support.processes import ServiceProcess, dev_proxy
from tests.support.valkey import ValkeyProcess

GREEDY = {"Authorization": f"Bearer {dev_token('team-a', 'greedy')}"}
POLITE = {"Authorization": f"Bearer {dev_token('team-b', 'polite')}"}
# A window of 20 x ~40 KB: past the 256 KiB a read's script copies itself, so read apart (WATCH + LRANGE on
# a connection of its own, four per worker).
BIG_ENTRIES = 20
BIG_CONTENT = "x" * 40_000
GREEDY_READS = 6
# Long enough for every request below to reach Valkey while it is paused, within the proxy's Valkey timeout.
PAUSE_MS = 3000


def _one_worker(valkey: ValkeyProcess, **extra: str) -> ServiceProcess:
    return dev_proxy(valkey.url, **{"SESSIONMEM_PROXY_WORKERS": "1", **extra})


@pytest.fixture
def big_read_proxy(valkey: ValkeyProcess) -> Iterator[ServiceProcess]:
    process = _one_worker(
        valkey,
        **{
            env.VALKEY_TIMEOUT_SECONDS: "20",
            env.QUOTA_BYTES_PER_SECOND: str(1 << 40),
            env.QUOTA_REQUESTS_PER_SECOND: "100000",
            env.QUOTA_BURST: "100000",
        },
    )
    process.start()
    yield process
    process.stop()


def _store_big(client: httpx.Client, who: dict[str, str], conversation: str) -> None:
    for _ in range(BIG_ENTRIES // 10):
        body = orjson.dumps({"entries": [{"role": "user", "content": BIG_CONTENT} for _ in range(10)]})
        answer = client.post(
            f"/v1/conversations/{conversation}/entries",
            content=body,
            headers={**who, "content-type": "application/json"},
        )
        assert answer.status_code == 200, answer.text


async def test_an_agents_big_reads_past_its_share_are_429_while_another_agents_is_served(
    big_read_proxy: ServiceProcess, valkey: ValkeyProcess
) -> None:
    with httpx.Client(base_url=big_read_proxy.base_url, timeout=30) as client:
        _store_big(client, GREEDY, "hoard")
        _store_big(client, POLITE, "notes")
    path = f"/v1/conversations/{{}}/entries?limit={BIG_ENTRIES}"
    async with httpx.AsyncClient(
        base_url=big_read_proxy.base_url, timeout=60, limits=httpx.Limits(max_connections=GREEDY_READS + 1)
    ) as client:
        # Valkey paused: every read below waits on its plan, so the greedy agent's reads all find their window
        # too big for the script at the same moment, and are all in the proxy at once however fast it is.
        valkey.client().execute_command("CLIENT", "PAUSE", str(PAUSE_MS), "ALL")
        answers = await asyncio.gather(
            *(client.get(path.format("hoard"), headers=GREEDY) for _ in range(GREEDY_READS)),
            client.get(path.format("notes"), headers=POLITE),
        )
    *greedy, polite = answers
    assert polite.status_code == 200, polite.text[:300]
    assert len(polite.json()["entries"]) == BIG_ENTRIES
    kinds = Counter(
        "served" if a.status_code == 200 else f"{a.status_code}:{a.json()['error']['type']}" for a in greedy
    )
    # Its share of the worker (two at once, as its exports and searches) is served; the rest is refused,
    # typed, with a Retry-After: never a 503 for it or anyone else.
    assert set(kinds) == {"served", "429:rate_limited"}, kinds
    assert kinds["served"] >= 1 and kinds["429:rate_limited"] >= 1, kinds
    for answer in greedy:
        if answer.status_code == 429:
            assert int(answer.headers["retry-after"]) >= 1
            assert "big answers" in answer.json()["error"]["message"]


SLOTS = 8
HELD = 12


@pytest.fixture
def slow_rate_proxy(valkey: ValkeyProcess) -> Iterator[ServiceProcess]:
    process = _one_worker(
        valkey,
        **{
            # No token comes back during the test: the burst is what each agent has.
            env.QUOTA_REQUESTS_PER_SECOND: "0.01",
            env.QUOTA_BURST: "3",
            # Fewer request slots than the greedy agent's refused requests below (and twice as many
            # connections: every client connection here is accepted).
            env.MAX_CONNECTIONS: str(SLOTS),
        },
    )
    process.start()
    yield process
    process.stop()


async def test_an_agent_asking_again_before_its_retry_after_is_answered_only_then(
    slow_rate_proxy: ServiceProcess,
) -> None:
    async with httpx.AsyncClient(
        base_url=slow_rate_proxy.base_url, timeout=30, limits=httpx.Limits(max_connections=HELD + 2)
    ) as client:
        read = "/v1/conversations/c/entries"
        for _ in range(3):
            assert (await client.get(read, headers=GREEDY)).status_code == 200
        before_refusal = time.monotonic()
        first = await client.get(read, headers=GREEDY)
        assert first.status_code == 429 and first.json()["error"]["type"] == "rate_limited"
        retry_after = int(first.headers["retry-after"])
        assert retry_after >= 1

        async def asked_again() -> tuple[httpx.Response, float]:
            answer = await client.get(read, headers=GREEDY)
            return answer, time.monotonic()

        # More refused requests than the worker has slots, and another agent's read among them.
        again = [asyncio.ensure_future(asked_again()) for _ in range(HELD)]
        polite = await client.get(read, headers=POLITE)
        held = await asyncio.gather(*again)
    assert polite.status_code == 200, polite.text[:300]
    for answer, answered_at in held:
        assert answer.status_code == 429 and answer.json()["error"]["type"] == "rate_limited", answer.text[:300]
        assert int(answer.headers["retry-after"]) >= 1
        # Not answered before the Retry-After it was given had passed (at most a second of it is held):
        # the earliest bound, which no slowness of the machine can break.
        assert answered_at - before_refusal >= min(retry_after, 1.0)


# Prose: ranking it costs far more CPU than reading it (every word is a token). ~1.7 MiB in all, less than
# the 2 MiB burst of a 1 MiB/s transfer rate: read alone, the search leaves the agent within its rate.
PROSE = "the quick brown fox jumps over the lazy dog while seven wizards quietly hex " * 640
PROSE_ENTRIES = 36
SEARCH_RATE = 1024 * 1024


def test_the_cpu_of_a_search_is_charged_to_the_agent(valkey: ValkeyProcess) -> None:
    writer = _one_worker(valkey, **{env.QUOTA_BYTES_PER_SECOND: str(1 << 40)})
    searcher = _one_worker(
        valkey,
        **{
            env.QUOTA_BYTES_PER_SECOND: str(SEARCH_RATE),
            env.QUOTA_REQUESTS_PER_SECOND: "1000",
            env.QUOTA_BURST: "1000",
        },
    )
    try:
        writer.start()
        with httpx.Client(base_url=writer.base_url, headers=GREEDY, timeout=30) as client:
            for _ in range(PROSE_ENTRIES // 6):
                body = {"entries": [{"role": "user", "content": PROSE} for _ in range(6)]}
                assert client.post("/v1/conversations/prose/entries", json=body).status_code == 200
        stored = PROSE_ENTRIES * len(PROSE)
        assert stored < 2 * env.MAX_BODY_BYTES - SEARCH_RATE // 4, "the bytes alone leave the burst unspent"
        searcher.start()
        with httpx.Client(base_url=searcher.base_url, headers=GREEDY, timeout=60) as client:
            found = client.get("/v1/conversations/prose/search", params={"q": "needle"})
            after = client.get("/v1/conversations/prose/entries", params={"limit": 1})
    finally:
        searcher.stop()
        writer.stop()
    assert found.status_code == 200 and found.json()["matches"] == [], found.text[:200]
    # Ranking every word took the worker far more CPU than moving the bytes; charged at ten seconds of the
    # rate per CPU-second, it leaves the agent in debt, refused until it has paid.
    assert after.status_code == 429 and "transfer rate" in after.json()["error"]["message"], after.text[:200]
