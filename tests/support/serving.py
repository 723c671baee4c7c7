"""An app served in the test's own event loop by granian's embedded server (the launcher's), with an httpx
client to it: the proxy's app is tested as granian serves it, with its parts (store, quotas) built by
the test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from sessionmem_launcher.serving import serve_in_background


@contextlib.asynccontextmanager
async def served_client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    server = await serve_in_background(app)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            yield client
    finally:
        await server.stop()
