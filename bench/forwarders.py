"""Profiling experiment: what one forwarded request costs a launcher-like process, by HTTP client.

Each factory is a bare ASGI app (like the launcher's memory endpoint) that answers every request by
forwarding a GET to ``BENCH_UPSTREAM`` (a URL) and relaying status and body; served by uvicorn with the
launcher's settings. ``none`` answers without an upstream call (the ASGI server's own floor), ``httpx`` is
what the launcher uses today (sessionmem_launcher.memory_client), ``aiohttp`` and ``raw`` (a keep-alive
connection pool on asyncio streams, HTTP/1.1 with Content-Length only) are the alternatives.

    BENCH_UPSTREAM=http://127.0.0.1:PORT/hello python -m uvicorn bench.forwarders:httpx_app --factory ...
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from starlette.types import Receive, Scope, Send

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
_HEADERS = [(b"content-type", b"application/json")]


def _upstream() -> str:
    return os.environ["BENCH_UPSTREAM"]


async def _respond(send: Send, status: int, body: bytes) -> None:
    headers = [*_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _drain(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


def none_app() -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await _drain(receive)
        await _respond(send, 200, b'{"status":"ok"}')

    return app


def httpx_app() -> ASGIApp:
    import httpx

    url = _upstream()
    # The launcher's client settings (sessionmem_launcher.memory_client.MemoryClient).
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(1.5), limits=httpx.Limits(max_connections=256, max_keepalive_connections=64)
    )

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await _drain(receive)
        async with asyncio.timeout(1.5):
            response = await client.request("GET", url, headers={"content-type": "application/json"})
        await _respond(send, response.status_code, response.content)

    return app


def aiohttp_app() -> ASGIApp:
    import aiohttp

    url = _upstream()
    sessions: list[aiohttp.ClientSession] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if not sessions:
            connector = aiohttp.TCPConnector(limit=256)
            sessions.append(aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=1.5)))
        await _drain(receive)
        async with sessions[0].get(url, headers={"content-type": "application/json"}) as response:
            body = await response.read()
            await _respond(send, response.status, body)

    return app


class _RawPool:
    """Keep-alive HTTP/1.1 connections to one upstream; a request takes an idle one or opens one."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = parts.path or "/"
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self, headers: bytes) -> tuple[int, bytes]:
        if self._idle:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        request = f"GET {self.path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n".encode() + headers + b"\r\n"
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        body = await reader.readexactly(length)
        self._idle.append((reader, writer))
        return int(head[9:12]), body


def raw_app() -> ASGIApp:
    pool = _RawPool(_upstream())
    headers = b"content-type: application/json\r\n"

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await _drain(receive)
        async with asyncio.timeout(1.5):
            status, body = await pool.get(headers)
        await _respond(send, status, body)

    return app
