"""A small HTTP/1.1 keep-alive client for the launcher's three peers (the proxy, the agent, a
summariser), and an in-process transport for the proxy's own app in direct mode.

The launcher is on every agent turn's path and starts on every cold start: a general client library
costs it milliseconds per hop and megabytes per pod. This one does only what those peers need:
Content-Length bodies (chunked answers are read too), pooled connections, and one retry on a pooled
connection the server had already closed (nothing was received, so nothing was processed).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools

Headers = list[tuple[bytes, bytes]]


class HttpError(OSError):
    """The peer could not be reached, or broke the exchange."""


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: Headers
    body: bytes

    def header(self, name: bytes) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return None


@dataclass(slots=True)
class _ResponseReader:
    status: int = 0
    headers: Headers = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    complete: bool = False
    keep_alive: bool = False
    parser: Any = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        # Asked here: once feed_data returns, httptools has reset and always answers False.
        self.keep_alive = bool(self.parser.should_keep_alive())


class HttpClient:
    """Requests to one origin (``http://host:port`` or ``https://...``) over pooled connections."""

    def __init__(self, base_url: str, max_idle: int = 64) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"unsupported URL {base_url!r}: http(s)://host[:port] expected")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/")
        default_port = self._port == (443 if self._ssl else 80)
        self._host_header = (self._host if default_port else f"{self._host}:{self._port}").encode()
        self._idle: deque[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = deque()
        self._max_idle = max_idle

    async def request(
        self, method: str, target: str, headers: Iterable[tuple[bytes, bytes]] = (), body: bytes | None = None
    ) -> HttpResponse:
        head = self._head(method, target, headers, body)
        for attempt in (0, 1):
            reused = bool(self._idle)
            reader, writer = self._idle.pop() if reused else await self._connect()
            try:
                writer.write(head + body if body else head)
                response, keep = await self._read(reader)
            except (OSError, asyncio.IncompleteReadError, httptools.HttpParserError, _NothingReceived) as exc:
                writer.close()
                if reused and attempt == 0 and isinstance(exc, _NothingReceived):
                    # The peer dropped idle connections (its keep-alive timeout): the others in the pool
                    # are as old, so retry once on a fresh connection.
                    self._drop_idle()
                    continue
                raise HttpError(f"{method} {target}: {type(exc).__name__}") from exc
            except BaseException:
                writer.close()  # cancelled (a timeout): the connection is mid-exchange, drop it
                raise
            if keep and len(self._idle) < self._max_idle:
                self._idle.append((reader, writer))
            else:
                writer.close()
            return response
        raise HttpError(f"{method} {target}: connection closed")  # pragma: no cover - loop always returns

    def _head(self, method: str, target: str, headers: Iterable[tuple[bytes, bytes]], body: bytes | None) -> bytes:
        lines = [f"{method} {self._prefix}{target} HTTP/1.1".encode(), b"host: " + self._host_header]
        lines += [name + b": " + value for name, value in headers]
        lines.append(b"content-length: " + str(len(body) if body else 0).encode())
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_connection(self._host, self._port, ssl=self._ssl)
        except OSError as exc:
            raise HttpError(f"cannot connect to {self._host}:{self._port}: {exc.strerror or exc}") from exc

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> tuple[HttpResponse, bool]:
        state = _ResponseReader()
        parser = httptools.HttpResponseParser(state)
        state.parser = parser
        received = False
        while not state.complete:
            try:
                data = await reader.read(65536)
            except OSError as exc:
                if not received:
                    raise _NothingReceived from exc  # reset before any answer: the request was not processed
                raise
            if not data:
                if not received:
                    raise _NothingReceived
                parser.feed_data(b"")  # lets a close-delimited body complete, or raises
                if not state.complete:
                    raise asyncio.IncompleteReadError(b"", None)
                break
            received = True
            parser.feed_data(data)
        return HttpResponse(parser.get_status_code(), state.headers, b"".join(state.chunks)), state.keep_alive

    def _drop_idle(self) -> None:
        while self._idle:
            _, writer = self._idle.pop()
            writer.close()

    async def aclose(self) -> None:
        self._drop_idle()


class _NothingReceived(Exception):
    """The server closed the connection before answering (an idle keep-alive connection it dropped)."""


AsgiApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Any]


class AsgiClient:
    """The same interface, served by an ASGI app in this process (the launcher's direct mode)."""

    def __init__(self, app: AsgiApp) -> None:
        self._app = app

    async def request(
        self, method: str, target: str, headers: Iterable[tuple[bytes, bytes]] = (), body: bytes | None = None
    ) -> HttpResponse:
        from urllib.parse import unquote

        path, _, query = target.partition("?")
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": unquote(path),
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in headers] + [(b"content-length", str(len(body or b"")).encode())],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
        }
        sent = False
        response = HttpResponse(500, [], b"")
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.Event().wait()  # nothing more: wait as a client that keeps the connection
            sent = True
            return {"type": "http.request", "body": body or b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                response.status = int(message["status"])
                response.headers = [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", [])]
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))

        await self._app(scope, receive, send)
        response.body = b"".join(chunks)
        return response

    async def aclose(self) -> None:
        return None
