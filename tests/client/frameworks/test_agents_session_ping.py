"""``SessionmemSession.ping``, the probe the SDK's network sessions offer (``RedisSession.ping``): the
redis suite's ports check that it answers True over the real stack; here, that an unreachable memory
endpoint answers False instead of raising (as upstream's fakeredis-only ping-failure test asks of Redis)."""

from __future__ import annotations

from sessionmem_client import AsyncMemoryClient
from sessionmem_client.openai_agents import SessionmemSession
from tests.support.valkey import free_port


async def test_ping_is_false_when_the_memory_endpoint_is_unreachable() -> None:
    client = AsyncMemoryClient(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    try:
        assert await SessionmemSession("ping-unreachable", client).ping() is False
    finally:
        await client.aclose()
