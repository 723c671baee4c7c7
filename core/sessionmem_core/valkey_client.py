"""Making the Valkey client the store runs on (standalone server today; one place to add others)."""

from __future__ import annotations

import valkey.asyncio as valkey_async


def connect(url: str, timeout_seconds: float, max_connections: int = 256) -> valkey_async.Valkey:
    """A pooled client; bounded timeouts so an unreachable Valkey turns into a 503, never a hang."""
    client: valkey_async.Valkey = valkey_async.Valkey.from_url(
        url,
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        max_connections=max_connections,
        health_check_interval=0,
        decode_responses=False,
    )
    return client
