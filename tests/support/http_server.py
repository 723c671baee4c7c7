"""A small HTTP/1.1 server: the launcher's two apps and the proxy run on it.

A general ASGI server is about 7 MB of a launcher's resident memory and, per request, costs more than the
proxy's whole operation; what both need is only this: keep-alive, bodies up to a fixed limit
(Content-Length or chunked), ``Expect: 100-continue``, one request at a time per connection, and a
graceful stop. An ASGI app serves every request, except those a ``Router`` claims: those go straight to
a handler that takes the parsed request and returns the whole answer, with no ASGI scope, no
``receive``/``send`` and no middleware in between (the proxy's two per-turn operations).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from http import HTTPStatus
from typing import Any, NamedTuple, cast
from urllib.parse import unquote

import httptools

from sessionmem_core.errors import PayloadTooLarge

AsgiApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Any]

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_JSON_HEADERS = ((b"content-type", b"application/json"),)
_INTERNAL_ERROR = b'{"error":{"type":"internal","message":"internal error"}}'


class Reply(NamedTuple):
    """A whole answer: status, headers (content-length and connection are the server's), body."""

    status: int
    headers: Sequence[tuple[bytes, bytes]]
    body: bytes


class HttpRequest:
    """A parsed request as a direct handler gets it; header names are lower-case."""

    __slots__ = ("body", "headers", "method", "path", "query")

    def __init__(self, method: bytes, path: str, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body


DirectHandler = Callable[[HttpRequest], Awaitable[Reply]]
# (method, decoded path) -> the handler that serves it directly, or None to hand the request to the ASGI app.
# Called for every request, so it must be cheap and must not raise.
Router = Callable[[bytes, str], DirectHandler | None]


class _Request:
    __slots__ = ("body", "complete", "headers", "method", "url", "version")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.complete = False
        self.method = b""
        self.version = "1.1"


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._request = _Request()
        self._size = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._discarding = False
        self._too_large: PayloadTooLarge | None = None
        self._lost = asyncio.Event()

    # -- asyncio.Protocol --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._lost.set()
        self._server.connections.discard(self)
        # The parser and this protocol refer to each other: without this, a closed connection (and the
        # request it last held) waits for the cycle collector instead of being freed here.
        self._parser = None

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if self._discarding or parser is None:
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reply_and_close(400, b'{"error":{"type":"invalid_request","message":"upgrade not supported"}}')
        except (httptools.HttpParserError, PayloadTooLarge):
            # httptools wraps what a callback raised: the size check is told apart by the flag it sets.
            if self._too_large is None:
                self._reply_and_close(400, b'{"error":{"type":"invalid_request","message":"malformed HTTP request"}}')
                return
            # Answer now, but keep reading (and dropping) what the client is still sending for a moment:
            # a client that is mid-upload only reads the answer once its upload went through.
            self._discarding = True
            self._reply_and_close(413, self._too_large.body(), linger_seconds=2.0)

    # -- httptools callbacks --
    def on_message_begin(self) -> None:
        self._request = _Request()
        self._size = 0

    def on_url(self, url: bytes) -> None:
        self._request.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._request.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        request = self._request
        parser = self._parser
        assert parser is not None  # called back from feed_data, so before connection_lost
        request.method = parser.get_method()
        request.version = parser.get_http_version()
        for name, value in request.headers:
            if name == b"content-length" and value.isdigit() and int(value) > self._server.max_body:
                self._too_large = PayloadTooLarge(f"request body exceeds {self._server.max_body} bytes")
                raise self._too_large
            if name == b"expect" and value.lower() == b"100-continue" and self._transport is not None:
                self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self._server.max_body:
            self._too_large = PayloadTooLarge(f"request body exceeds {self._server.max_body} bytes")
            raise self._too_large
        self._request.body.append(body)

    def on_message_complete(self) -> None:
        self._request.complete = True
        assert self._transport is not None
        self._transport.pause_reading()  # one request at a time: the next is read after this answer
        request = self._request
        assert self._parser is not None  # called back from feed_data, so before connection_lost
        keep_alive = self._parser.should_keep_alive()
        url = httptools.parse_url(request.url)
        raw_path = url.path or b"/"
        text_path = raw_path.decode("latin-1")
        path = unquote(text_path) if "%" in text_path else text_path
        router = self._server.router
        handler = router(request.method, path) if router is not None else None
        if handler is not None:
            direct = HttpRequest(request.method, path, url.query or b"", request.headers, b"".join(request.body))
            coroutine = self._handle_direct(handler, direct, keep_alive)
        else:
            coroutine = self._handle(request, keep_alive, raw_path, path, url.query or b"")
        self._task = asyncio.get_running_loop().create_task(coroutine)
        self._server.tasks.add(self._task)
        self._task.add_done_callback(self._server.tasks.discard)

    # -- handling --
    async def _handle_direct(self, handler: DirectHandler, request: HttpRequest, keep_alive: bool) -> None:
        try:
            reply = await handler(request)
        except Exception:
            # The handler owns its error answers; this is the last line, so the connection stays usable.
            reply = Reply(500, _JSON_HEADERS, _INTERNAL_ERROR)
        if not self._closed:
            self._write(reply.status, reply.headers, reply.body, keep_alive, head_only=False)

    async def _handle(self, request: _Request, keep_alive: bool, raw_path: bytes, path: str, query: bytes) -> None:
        transport = self._transport
        assert transport is not None
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": request.version,
            "method": request.method.decode("ascii"),
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": request.headers,
            "client": transport.get_extra_info("peername"),
            "server": transport.get_extra_info("sockname"),
        }
        body = b"".join(request.body)
        delivered = False
        status = 500
        headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await self._lost.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))

        try:
            await self._server.app(scope, receive, send)
        except Exception:
            status, headers = 500, list(_JSON_HEADERS)
            chunks = [_INTERNAL_ERROR]
        if not self._closed:
            self._write(status, headers, b"".join(chunks), keep_alive, head_only=request.method == b"HEAD")

    def _write(
        self, status: int, headers: Sequence[tuple[bytes, bytes]], payload: bytes, keep_alive: bool, head_only: bool
    ) -> None:
        transport = self._transport
        assert transport is not None
        keep_alive = keep_alive and not self._server.stopping
        head = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Unknown"))]
        head += [k + b": " + v for k, v in headers if k.lower() not in (b"content-length", b"connection")]
        head.append(b"content-length: %d" % len(payload))
        if not keep_alive:
            head.append(b"connection: close")
        transport.write(b"\r\n".join(head) + b"\r\n\r\n" + (b"" if head_only else payload))
        if keep_alive:
            transport.resume_reading()
        else:
            transport.close()

    def _reply_and_close(self, status: int, body: bytes, linger_seconds: float = 0.0) -> None:
        if self._transport is None or self._closed:
            return
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        self._transport.write(head % (status, _REASONS[status], len(body)) + body)
        if linger_seconds:
            asyncio.get_running_loop().call_later(linger_seconds, self._transport.close)
        else:
            self._transport.close()

    def close_if_idle(self) -> None:
        if self._transport is not None and (self._task is None or self._task.done()):
            self._transport.close()


class HttpServer:
    def __init__(self, app: AsgiApp, max_body: int, router: Router | None = None) -> None:
        self.app = app
        self.max_body = max_body
        self.router = router
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, reuse_port: bool = False) -> None:
        """``reuse_port``: several processes listen on the same port, each with its own socket and accept
        queue, and the kernel spreads new connections over them (a shared socket instead lets whichever
        process wakes first take a whole burst of connections)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, reuse_address=True, reuse_port=reuse_port or None, backlog=2048
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_seconds: float = 10.0) -> None:
        """Stop accepting, let requests under way finish (bounded), then close every connection."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close_if_idle()
        if self.tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), grace_seconds)
        for connection in list(self.connections):
            if connection._transport is not None:
                connection._transport.close()
        if self._server is not None:
            await self._server.wait_closed()
