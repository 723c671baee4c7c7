"""A greedy tenant against the real proxy process (as users start it) and a real valkey-server: its quota
breaches are typed answers to it alone, and a turn of adversarial text for the redactor is answered while
another tenant keeps being served."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from sessionmem_core import env
from sessionmem_core.devauth import dev_token
from tests.support.processes import ServiceProcess, dev_proxy
from tests.support.valkey import ValkeyProcess

GREEDY = {"Authorization": f"Bearer {dev_token('team-a', 'greedy')}"}
POLITE = {"Authorization": f"Bearer {dev_token('team-b', 'polite')}"}


@pytest.fixture
def small_quota_proxy(valkey_server: ValkeyProcess) -> Iterator[ServiceProcess]:
    proc = dev_proxy(
        valkey_server.url,
        **{
            env.QUOTA_CONVERSATIONS: "5",
            env.QUOTA_BYTES: "200000",
            # A rate low enough that no token comes back during the test: the burst is what an agent has.
            env.QUOTA_REQUESTS_PER_SECOND: "0.01",
            env.QUOTA_BURST: "60",
        },
    )
    proc.start()
    yield proc
    proc.stop()


def _body(content: str) -> dict[str, object]:
    return {"entries": [{"role": "user", "content": content}]}


async def test_quota_breaches_are_typed_and_confined_to_the_offender(small_quota_proxy: ServiceProcess) -> None:
    async with httpx.AsyncClient(base_url=small_quota_proxy.base_url, timeout=10) as client:
        greedy: Counter[str] = Counter()

        async def greedy_append(i: int) -> None:
            response = await client.post(f"/v1/conversations/g{i}/entries", json=_body("x" * 20_000), headers=GREEDY)
            greedy[f"{response.status_code}:{response.json().get('error', {}).get('type', 'ok')}"] += 1

        async def polite_turn(i: int) -> int:
            write = await client.post("/v1/conversations/p/entries", json=_body(f"turn {i}"), headers=POLITE)
            read = await client.get("/v1/conversations/p/entries", headers=POLITE)
            return max(write.status_code, read.status_code)

        results = await asyncio.gather(*(greedy_append(i) for i in range(100)), *(polite_turn(i) for i in range(20)))
        polite = [r for r in results if r is not None]
        assert polite == [200] * 20, polite
        # The greedy agent got its burst, then typed answers: 507 for storage, 429 for rate; never a 5xx
        # other than 507, never an untyped error.
        assert set(greedy) <= {"200:ok", "507:quota_exceeded", "429:rate_limited"}, greedy
        assert greedy["507:quota_exceeded"] > 0 and greedy["429:rate_limited"] > 0, greedy
        limited = await client.get("/v1/conversations/g0/entries", headers=GREEDY)
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1


async def test_adversarial_redactor_input_is_answered_while_others_are_served(
    proxy_process: ServiceProcess,
) -> None:
    # 200 Ki characters of e-mail-like text without an end: the shape that made the old redactor quadratic.
    adversarial = ("a@a." * 51_200)[:200_000]
    async with httpx.AsyncClient(base_url=proxy_process.base_url, timeout=10) as client:
        hostile = asyncio.ensure_future(
            client.post(
                "/v1/conversations/h/entries",
                params={"redact": "email,phone,card"},
                json=_body(adversarial),
                headers=GREEDY,
            )
        )
        reads = [await client.get("/v1/conversations/p/entries", headers=POLITE) for _ in range(20)]
        answer = await hostile
    assert answer.status_code == 200, answer.text
    assert [r.status_code for r in reads] == [200] * 20
