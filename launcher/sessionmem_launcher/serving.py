"""The launcher's HTTP serving: granian's embedded server (Rust, hyper) on the running event loop, one per
listening port, and the serving limits hyper does not enforce itself, checked per request.

What hyper enforces (docs/limits-launcher.md): a request head larger than its read buffer (431, no body),
more than 100 headers (431, no body), a head not complete within the header timeout, an idle keep-alive
connection past that same timer (hyper starts it whenever it waits for a head), malformed requests (400),
in-order answers to pipelined requests. What ``RequestLimits`` adds, with typed bodies: header count (431),
URL length (414), body size (413), body timeout (408) and requests in flight (503).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from granian._granian import ListenerSpec
from granian._granian import RSGIHTTPProtocol as HTTPProtocol
from granian._granian import RSGIProtocolClosed as ProtocolClosed
from granian._granian import RSGIProtocolError as ProtocolError
from granian.constants import HTTPModes, Interfaces
from granian.log import LogLevels
from granian.rsgi import Scope
from granian.server.embed import Server

from sessionmem_core.env import ServingLimits
from sessionmem_core.errors import (
    HeadersTooLarge,
    InvalidRequest,
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    SessionMemError,
    UriTooLong,
)
from sessionmem_infra.deadlines import Deadlines
from sessionmem_infra.serving import http1_settings, open_connections

JSON = "application/json"
JSON_HEADERS = [("content-type", JSON)]
_LISTEN_TIMEOUT_SECONDS = 10.0


Handler = Callable[[Scope, HTTPProtocol], Awaitable[None]]


class RsgiApp(Protocol):
    async def __rsgi__(self, scope: Scope, proto: HTTPProtocol) -> None: ...


class RequestLimits:
    """The per-request checks of one listener, and its count of requests in flight."""

    __slots__ = ("_body_deadlines", "_limits", "in_flight")

    def __init__(self, limits: ServingLimits) -> None:
        self._limits = limits
        self.in_flight = 0
        self._body_deadlines = Deadlines(limits.body_timeout_seconds)

    async def serve(
        self, scope: Scope, proto: HTTPProtocol, handler: Callable[[Scope, HTTPProtocol], Awaitable[None]]
    ) -> None:
        """Serve one request within the limits: refused with its typed answer when over one, counted in
        flight while ``handler`` runs, and any typed error of the handler answered as such."""
        try:
            self.admit(scope)
        except SessionMemError as exc:
            respond_error(proto, exc)
            return
        self.in_flight += 1
        try:
            await handler(scope, proto)
        except SessionMemError as exc:
            respond_error(proto, exc)
        finally:
            self.in_flight -= 1

    def admit(self, scope: Scope) -> None:
        """Raise the typed error of a request over a limit that needs no body to judge."""
        limits = self._limits
        if self.in_flight >= limits.max_connections:
            raise Overloaded(f"more than {limits.max_connections} requests in flight")
        # The decoded path's UTF-8 length: the raw target may be longer (percent-escapes), but the head
        # as a whole is bounded by max_header_bytes before the request gets here.
        url_bytes = len(scope.path.encode()) + len(scope.query_string)
        if url_bytes > limits.max_url_bytes:
            raise UriTooLong(f"request target exceeds {limits.max_url_bytes} bytes")
        if len(scope.headers.items()) > limits.max_header_count:
            raise HeadersTooLarge(f"more than {limits.max_header_count} request headers")

    async def read_body(self, scope: Scope, proto: HTTPProtocol) -> bytes:
        """The whole body, at most ``max_body_bytes``, all of it within ``body_timeout_seconds``."""
        headers = scope.headers
        length = headers.get("content-length")
        if length == "0" or (length is None and "transfer-encoding" not in headers):
            return b""  # nothing to wait for: asking granian for the body would cost a round to its thread
        limit = self._limits.max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        try:
            with self._body_deadlines.timeout():
                if length is not None and length.isdigit():
                    # A declared length within the limit bounds what hyper hands over (it frames the body
                    # by that length): one hand-off for the whole body, where iterating costs one per
                    # chunk and one more to learn the body ended. It also tells a body cut short (the
                    # client went away first) from a whole one, which iterating does not: granian's
                    # iterator just ends. A chunked body's cut is caught by the JSON parser downstream.
                    try:
                        return await proto()
                    except (ProtocolClosed, ProtocolError) as exc:
                        raise InvalidRequest("the request body ended before its declared length") from exc
                async for chunk in proto:
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(f"request body exceeds {limit} bytes")
                    chunks.append(chunk)
        except TimeoutError as exc:
            raise RequestTimeout(f"request body not received within {self._limits.body_timeout_seconds} s") from exc
        return b"".join(chunks)


def respond(proto: HTTPProtocol, status: int, body: bytes, headers: list[tuple[str, str]] | None = None) -> None:
    proto.response_bytes(status, JSON_HEADERS if headers is None else headers, body)


# Answers after which the connection is not reused: the request's body (or more) may be left unread on it.
_CLOSING = frozenset({408, 413, 414, 431})
_JSON_AND_CLOSE = [*JSON_HEADERS, ("connection", "close")]


def json_headers(status: int) -> list[tuple[str, str]]:
    return _JSON_AND_CLOSE if status in _CLOSING else JSON_HEADERS


def respond_error(proto: HTTPProtocol, error: SessionMemError) -> None:
    proto.response_bytes(error.status, json_headers(error.status), error.body())


class _BoundServer(Server):
    """granian's embedded server bound to a socket it opens before serving, so ``port`` 0 can be read back.

    granian (on Linux) otherwise hands its workers a socket *spec* each binds anew; with port 0 nobody would
    know the port. This is the path granian takes on other platforms (a pre-built socket), taken always."""

    bound: socket.socket | None = None

    def _init_shared_socket(self) -> None:
        holder = ListenerSpec(self.bind_addr, self.bind_port, self.backlog).build()
        self._ssp = None
        self._shd = holder  # type: ignore[assignment]  # granian declares it None until bound
        self._sfd = holder.get_fd()
        self.bound = socket.socket(fileno=os.dup(holder.get_fd()))


class EmbeddedServer:
    """One listening port served by granian on the running event loop until ``stop()``."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        limits: ServingLimits,
        interface: Interfaces = Interfaces.RSGI,
    ) -> None:
        self._server = _BoundServer(
            app,
            address=host,
            port=port,
            interface=interface,
            http=HTTPModes.http1,
            websockets=False,
            backlog=1024,
            backpressure=open_connections(limits),
            http1_settings=http1_settings(limits),
            log_level=LogLevels.error,
        )
        self._task: asyncio.Task[None] | None = None
        self.port = port

    async def start(self) -> None:
        task = self._task = asyncio.create_task(self._server.serve())
        # serve() binds at once; granian's worker thread then starts listening on that socket.
        async with asyncio.timeout(_LISTEN_TIMEOUT_SECONDS):
            while (bound := self._server.bound) is None or not bound.getsockopt(
                socket.SOL_SOCKET, socket.SO_ACCEPTCONN
            ):
                if task.done():
                    task.result()  # the bind failed: raise its error
                    raise RuntimeError("granian stopped before listening")
                await asyncio.sleep(0.001)
        self.port = bound.getsockname()[1]
        bound.close()  # a duplicate of granian's socket: closing it leaves granian's open

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.stop()  # type: ignore[no-untyped-call]
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self._server._shd = None  # the listening socket closes with its last reference


async def serve_in_background(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    limits: ServingLimits | None = None,
    interface: Interfaces | None = None,
) -> EmbeddedServer:
    """Serve ``app`` on the running loop until ``stop()``; ``port`` 0 picks a free one (see ``.port``).
    An object with ``__rsgi__`` is served as RSGI, anything else as an ASGI app without lifespan."""
    if interface is None:
        interface = Interfaces.RSGI if hasattr(app, "__rsgi__") else Interfaces.ASGINL
    server = EmbeddedServer(app, host, port, limits or ServingLimits(), interface)
    await server.start()
    return server
