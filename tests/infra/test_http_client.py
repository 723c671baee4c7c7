"""sessionmem's own HTTP/1.1 clients (asyncio and blocking) against granian (the server the proxy and the
launcher run on), at the edges a general library would cover: keep-alive reuse, a pooled connection the
server dropped (its idle timeout), timeouts, refused connections, header injection, and uvloop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, MutableMapping
from typing import Any

import orjson
import pytest
import uvloop

from sessionmem_core.env import ServingLimits
from sessionmem_infra.http_client import (
    AnswerTooLarge,
    BlockingHttpClient,
    HttpClient,
    HttpError,
    HttpResponse,
    HttpTimeout,
)
from tests.support.serving import TestServer, serve_in_background
from tests.support.valkey import free_port

# The peer closes a kept-alive connection idle for this long: how a test makes the server drop one.
IDLE_SECONDS = 0.3


class Peer:
    """An echo app on granian that records the client port of every request, so a test can tell which
    requests shared a connection."""

    def __init__(self) -> None:
        self.client_ports: list[int] = []
        self.paths: list[str] = []
        self.server: TestServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    @property
    def connections(self) -> set[int]:
        return set(self.client_ports)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        self.client_ports.append(int(scope["client"][1]))
        self.paths.append(scope["path"])
        message = await receive()
        if scope["path"] == "/hang":
            await asyncio.sleep(30)
        body = orjson.dumps({"path": scope["path"], "body": message.get("body", b"").decode()})
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
async def server() -> AsyncIterator[Peer]:
    peer = Peer()
    limits = ServingLimits(header_timeout_seconds=IDLE_SECONDS, idle_timeout_seconds=IDLE_SECONDS)
    peer.server = await serve_in_background(peer, limits=limits)
    yield peer
    await peer.server.stop()


async def _let_the_server_drop_idle_connections() -> None:
    await asyncio.sleep(IDLE_SECONDS * 3)


async def test_async_client_reuses_a_connection_and_survives_the_server_dropping_it(server: Peer) -> None:
    client = HttpClient(f"http://127.0.0.1:{server.port}")
    try:
        first = await client.request("POST", "/a", [(b"content-type", b"text/plain")], b"hello")
        second = await client.request("GET", "/b")
        assert len(server.connections) == 1, "both requests went over one kept-alive connection"
        await _let_the_server_drop_idle_connections()
        third = await client.request("GET", "/c")
        assert len(server.connections) == 2, "the dropped connection was replaced by a new one"
    finally:
        await client.aclose()
    assert orjson.loads(first.body) == {"path": "/a", "body": "hello"}
    assert first.header(b"content-type") == "application/json"
    assert [orjson.loads(r.body)["path"] for r in (second, third)] == ["/b", "/c"]


async def test_blocking_client_reuses_a_connection_and_survives_the_server_dropping_it(server: Peer) -> None:
    client = BlockingHttpClient(f"http://127.0.0.1:{server.port}", timeout=5)
    try:
        first = await asyncio.to_thread(client.request, "POST", "/a", [], b"hello")
        second = await asyncio.to_thread(client.request, "GET", "/b")
        assert len(server.connections) == 1, "both requests went over one kept-alive connection"
        await _let_the_server_drop_idle_connections()
        third = await asyncio.to_thread(client.request, "GET", "/c")
        assert len(server.connections) == 2, "the dropped connection was replaced by a new one"
    finally:
        client.close()
    assert orjson.loads(first.body) == {"path": "/a", "body": "hello"}
    assert [orjson.loads(r.body)["path"] for r in (second, third)] == ["/b", "/c"]


async def test_a_timeout_drops_the_connection_and_the_next_request_works(server: Peer) -> None:
    aclient = HttpClient(f"http://127.0.0.1:{server.port}", timeout=0.2)
    bclient = BlockingHttpClient(f"http://127.0.0.1:{server.port}", timeout=0.2)
    try:
        began = time.monotonic()
        with pytest.raises(HttpTimeout):
            await aclient.request("GET", "/hang")
        assert time.monotonic() - began < 5, "the exchange was cut at its deadline, not left to hang"
        with pytest.raises(HttpTimeout):
            await asyncio.to_thread(bclient.request, "GET", "/hang")
        # A late answer to /hang must never be read as the answer to the next request.
        assert orjson.loads((await aclient.request("GET", "/next")).body)["path"] == "/next"
        assert orjson.loads((await asyncio.to_thread(bclient.request, "GET", "/next")).body)["path"] == "/next"
    finally:
        await aclient.aclose()
        bclient.close()


async def test_a_refused_connection_is_an_http_error() -> None:
    port = free_port()
    with pytest.raises(HttpError, match="cannot connect"):
        await HttpClient(f"http://127.0.0.1:{port}").request("GET", "/")
    with pytest.raises(HttpError, match="cannot connect"):
        BlockingHttpClient(f"http://127.0.0.1:{port}", timeout=1).request("GET", "/")


async def test_a_header_that_would_inject_a_line_is_refused_before_sending(server: Peer) -> None:
    aclient = HttpClient(f"http://127.0.0.1:{server.port}")
    bclient = BlockingHttpClient(f"http://127.0.0.1:{server.port}")
    for bad in ([(b"x-a", b"v\r\nx-injected: 1")], [(b"x-a\r\nx-b", b"v")], [(b"x-a: b", b"v")]):
        with pytest.raises(ValueError, match="invalid HTTP header"):
            await aclient.request("GET", "/", bad)
        with pytest.raises(ValueError, match="invalid HTTP header"):
            bclient.request("GET", "/", bad)
    assert not server.client_ports, "nothing was sent"


def _on_uvloop(test: Callable[[int], Coroutine[Any, Any, None]], port: int) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(test(port))


async def test_the_async_client_runs_on_uvloop(server: Peer) -> None:
    # uvloop's transports are not asyncio.Transport subclasses: the client must not assume they are.
    async def exchange(port: int) -> None:
        client = HttpClient(f"http://127.0.0.1:{port}", timeout=5)
        try:
            for path in ("/one", "/two"):
                assert orjson.loads((await client.request("GET", path)).body)["path"] == path
        finally:
            await client.aclose()

    await asyncio.to_thread(_on_uvloop, exchange, server.port)


async def test_one_connection_busy_for_longer_than_the_timeout_is_not_cut(server: Peer) -> None:
    # The timer outlives exchanges: each exchange must get its own deadline, not the first one's.
    client = HttpClient(f"http://127.0.0.1:{server.port}", timeout=0.3)
    try:
        began = time.monotonic()
        answered = 0
        while time.monotonic() - began < 0.9:
            assert (await client.request("GET", "/quick")).status == 200
            answered += 1
        assert len(server.connections) == 1
        cut = time.monotonic()
        with pytest.raises(HttpTimeout):
            await client.request("GET", "/hang")
        waited = time.monotonic() - cut
    finally:
        await client.aclose()
    assert answered > 10
    assert 0.25 < waited < 1.0, waited


async def test_the_blocking_client_can_be_shared_between_threads(server: Peer) -> None:
    # Each exchange takes its connection out of the pool: threads never read each other's answers.
    client = BlockingHttpClient(f"http://127.0.0.1:{server.port}", timeout=5)

    def calls(thread: int) -> list[str]:
        return [orjson.loads(client.request("GET", f"/t{thread}/{i}").body)["path"] for i in range(20)]

    try:
        answers = await asyncio.gather(*(asyncio.to_thread(calls, t) for t in range(6)))
    finally:
        client.close()
    assert answers == [[f"/t{t}/{i}" for i in range(20)] for t in range(6)]


async def test_an_answer_over_the_limit_is_refused_and_its_connection_dropped(server: Peer) -> None:
    """A peer cannot make the client hold more than ``max_answer_bytes``: the answer is refused (typed)
    and the connection it came on is not reused."""
    big = "x" * 4096
    client = HttpClient(f"http://127.0.0.1:{server.port}", max_answer_bytes=2048)
    blocking = BlockingHttpClient(f"http://127.0.0.1:{server.port}", max_answer_bytes=2048)
    try:
        small = await client.request("POST", "/small", body=b"ok")
        with pytest.raises(AnswerTooLarge):
            await client.request("POST", "/big", body=big.encode())
        after = await client.request("GET", "/after")
        with pytest.raises(AnswerTooLarge):
            await asyncio.to_thread(blocking.request, "POST", "/big", (), big.encode())
    finally:
        await client.aclose()
        blocking.close()
    assert small.status == after.status == 200
    assert len(server.connections) == 3, "the connection of the refused answer was dropped, not reused"


async def _drops_every_second_request() -> tuple[asyncio.Server, int, list[str]]:
    """A peer that answers the first request of each connection and closes the connection on the second
    after reading it, without answering: the client cannot tell whether it was processed."""
    seen: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for answered in (True, False):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                seen.append(head.split(b" ", 2)[0].decode() + " " + head.split(b" ", 2)[1].decode())
                if answered:
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


@pytest.mark.parametrize("blocking", [False, True])
async def test_only_an_idempotent_request_is_sent_again_on_a_connection_the_peer_closed(
    blocking: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A request on a pooled connection the peer closed without answering: a POST fails (the peer may have
    processed it) unless its caller says it may be repeated; a PUT is sent again, once, and the client
    says so at debug level."""
    caplog.set_level(logging.DEBUG, logger="sessionmem.http")
    peer, port, seen = await _drops_every_second_request()
    url = f"http://127.0.0.1:{port}"
    sync = BlockingHttpClient(url, timeout=5)
    lean = HttpClient(url, timeout=5)

    async def send(method: str, path: str, idempotent: bool | None = None) -> HttpResponse:
        if blocking:
            return await asyncio.to_thread(sync.request, method, path, (), b"x", idempotent)
        return await lean.request(method, path, (), b"x", idempotent)

    try:
        await send("GET", "/warm")
        with pytest.raises(HttpError):
            await send("POST", "/append")
        await send("GET", "/warm")
        repeated = await send("POST", "/append", idempotent=True)
        put = await send("PUT", "/replace")
    finally:
        sync.close()
        await lean.aclose()
        peer.close()
        await peer.wait_closed()
    assert [r.status for r in (repeated, put)] == [200, 200]
    assert seen == [
        "GET /warm", "POST /append", "GET /warm", "POST /append", "POST /append", "PUT /replace", "PUT /replace"
    ]  # fmt: skip
    retries = [r for r in caplog.records if "sending again" in r.getMessage()]
    assert len(retries) == 2 and all(r.levelno == logging.DEBUG for r in retries)
