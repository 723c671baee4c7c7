"""Opening a connection is bounded on its own: a peer whose address drops the SYN (a Service IP whose
pod is gone) fails the call with a typed timeout within the connect bound, instead of holding it for the
kernel's SYN retries (minutes); the launcher then answers a typed 503 and the managed loop fails open.

The black hole is a listening socket whose accept queue is full and never drained: Linux drops further
SYNs to it (net.ipv4.tcp_abort_on_overflow=0, the default), as a dropped packet on the wire would be."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from opentelemetry import trace

from sessionmem_core import env
from sessionmem_core.env import LauncherSettings
from sessionmem_core.keys import parse_conversation_id
from sessionmem_infra.http_client import BlockingHttpClient, HttpClient, HttpTimeout
from sessionmem_infra.telemetry import MemoryTracer
from sessionmem_launcher.forward import CallerHeaders, forwarder_from_settings

CONNECT_TIMEOUT = 0.2
# Far below the kernel's SYN retry schedule (about 127 s with net.ipv4.tcp_syn_retries=6): a call still
# pending after this never had a connect bound.
HANG = 30.0


@pytest.fixture
def black_hole() -> Iterator[str]:
    """``127.0.0.1:port`` where a new connection is never accepted nor refused."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    held: list[socket.socket] = []
    try:
        while True:  # fill the accept queue until a connect no longer completes
            sock = socket.socket()
            sock.settimeout(CONNECT_TIMEOUT)
            try:
                sock.connect(("127.0.0.1", port))
            except TimeoutError:
                sock.close()
                break
            held.append(sock)
            assert len(held) < 64, "the accept queue never filled"
        yield f"127.0.0.1:{port}"
    finally:
        for sock in held:
            sock.close()
        server.close()


async def test_the_async_client_gives_up_connecting_at_its_connect_bound(black_hole: str) -> None:
    # The answer's own timeout is long: only the connect bound can end this call.
    client = HttpClient(f"http://{black_hole}", timeout=HANG * 4, connect_timeout=CONNECT_TIMEOUT)
    try:
        async with asyncio.timeout(HANG):
            with pytest.raises(HttpTimeout, match="cannot connect"):
                await client.request("GET", "/")
    finally:
        await client.aclose()


async def test_without_a_connect_bound_the_request_timeout_bounds_connecting(black_hole: str) -> None:
    client = HttpClient(f"http://{black_hole}", timeout=CONNECT_TIMEOUT)
    async with asyncio.timeout(HANG):
        with pytest.raises(HttpTimeout, match="cannot connect"):
            await client.request("GET", "/")


async def test_the_blocking_client_gives_up_connecting_at_its_connect_bound(black_hole: str) -> None:
    client = BlockingHttpClient(f"http://{black_hole}", connect_timeout=CONNECT_TIMEOUT)
    async with asyncio.timeout(HANG):
        with pytest.raises(HttpTimeout, match="cannot connect"):
            await asyncio.to_thread(client.request, "GET", "/")


def test_the_launcher_reads_its_connect_bound_from_the_environment() -> None:
    default = LauncherSettings.from_env({})
    assert default.proxy_connect_timeout_seconds == env.DEFAULT_PROXY_CONNECT_TIMEOUT_SECONDS
    assert default.proxy_connect_timeout_seconds <= default.proxy_timeout_seconds
    assert LauncherSettings.from_env({env.PROXY_CONNECT_TIMEOUT_SECONDS: "0.25"}).proxy_connect_timeout_seconds == 0.25
    with pytest.raises(env.ConfigError):
        LauncherSettings.from_env({env.PROXY_CONNECT_TIMEOUT_SECONDS: "0"})


async def test_a_proxy_that_drops_connections_is_a_typed_503_from_the_launcher(black_hole: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("a-token")
    settings = LauncherSettings.from_env(
        {
            env.PROXY_URL: f"http://{black_hole}",
            env.TOKEN_PATH: str(token),
            env.PROXY_CONNECT_TIMEOUT_SECONDS: str(CONNECT_TIMEOUT),
            env.PROXY_TIMEOUT_SECONDS: str(HANG * 4),
        }
    )
    forwarder = forwarder_from_settings(settings, MemoryTracer(trace.NoOpTracerProvider(), "launcher"))
    try:
        async with asyncio.timeout(HANG):
            reply = await forwarder.read(parse_conversation_id("c1"), CallerHeaders())
    finally:
        await forwarder.aclose()
    assert reply.status == 503
    assert orjson.loads(reply.body)["error"]["type"] == "backend_unavailable"
