"""The project's HTTP server: requests a ``Router`` claims go straight to their handler, the rest to the
ASGI app, over the same kept-alive connection; ``reuse_port`` lets several servers share one port."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import orjson
import pytest

from sessionmem_core.http_server import DirectHandler, HttpRequest, HttpServer, Reply
from tests.support.valkey import free_port


async def _asgi(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"asgi " + scope["path"].encode()})


async def _echo(request: HttpRequest) -> Reply:
    body = orjson.dumps(
        {
            "method": request.method.decode(),
            "path": request.path,
            "query": request.query.decode(),
            "auth": dict(request.headers).get(b"authorization", b"").decode(),
            "body": request.body.decode(),
        }
    )
    return Reply(201, [(b"content-type", b"application/json"), (b"x-direct", b"1")], body)


async def _broken(request: HttpRequest) -> Reply:
    raise RuntimeError("handler bug")


def _router(method: bytes, path: str) -> DirectHandler | None:
    if path.startswith("/direct"):
        return _echo
    if path == "/broken":
        return _broken
    return None


class _Conn:
    """One kept-alive client connection that reads each answer by its content-length."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> _Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def request(self, raw: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        self.writer.write(raw)
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        status_line, *lines = head[:-4].split(b"\r\n")
        headers = {k.lower(): v for k, _, v in (line.partition(b": ") for line in lines)}
        body = await asyncio.wait_for(self.reader.readexactly(int(headers[b"content-length"])), 5)
        return int(status_line.split()[1]), headers, body

    def close(self) -> None:
        self.writer.close()


async def test_routed_requests_reach_their_handler_and_the_rest_the_asgi_app_on_one_connection() -> None:
    server = HttpServer(_asgi, max_body=1024, router=_router)
    await server.start("127.0.0.1", 0)
    conn = await _Conn.open(server.port)
    try:
        status, headers, body = await conn.request(
            b"POST /direct/a%20b?limit=40 HTTP/1.1\r\nhost: x\r\nAuthorization: Bearer t\r\n"
            b"content-length: 5\r\n\r\nhello"
        )
        assert status == 201 and headers[b"x-direct"] == b"1" and b"connection" not in headers
        assert orjson.loads(body) == {
            "method": "POST",
            "path": "/direct/a b",
            "query": "limit=40",
            "auth": "Bearer t",
            "body": "hello",
        }
        status, _, body = await conn.request(b"GET /other HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (status, body) == (200, b"asgi /other")
        assert len(server.connections) == 1, "both answers came over the one kept-alive connection"
    finally:
        conn.close()
        await server.stop()


async def test_a_failing_handler_answers_a_typed_500_and_the_connection_stays_usable() -> None:
    server = HttpServer(_asgi, max_body=1024, router=_router)
    await server.start("127.0.0.1", 0)
    conn = await _Conn.open(server.port)
    try:
        status, headers, body = await conn.request(b"GET /broken HTTP/1.1\r\nhost: x\r\n\r\n")
        assert status == 500 and headers[b"content-type"] == b"application/json"
        assert orjson.loads(body)["error"]["type"] == "internal"
        status, _, _ = await conn.request(b"GET /direct HTTP/1.1\r\nhost: x\r\n\r\n")
        assert status == 201
    finally:
        conn.close()
        await server.stop()


async def test_a_routed_request_over_the_body_limit_is_refused_before_its_handler_runs() -> None:
    server = HttpServer(_asgi, max_body=8, router=_router)
    await server.start("127.0.0.1", 0)
    conn = await _Conn.open(server.port)
    try:
        status, _, body = await conn.request(b"POST /direct HTTP/1.1\r\nhost: x\r\ncontent-length: 9\r\n\r\n123456789")
        assert status == 413 and orjson.loads(body)["error"]["type"] == "payload_too_large"
    finally:
        conn.close()
        await server.stop()


async def test_reuse_port_lets_two_servers_listen_on_one_port_and_without_it_the_second_fails() -> None:
    port = free_port()
    first, second = HttpServer(_asgi, 1024), HttpServer(_asgi, 1024)
    await first.start("127.0.0.1", port, reuse_port=True)
    try:
        await second.start("127.0.0.1", port, reuse_port=True)
        await second.stop()
        with pytest.raises(OSError):
            await HttpServer(_asgi, 1024).start("127.0.0.1", port)
    finally:
        await first.stop()
