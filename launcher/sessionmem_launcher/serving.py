"""The launcher's HTTP serving: granian's embedded server (Rust, hyper) on the running event loop, one per
listening port, with the serving limits of ``sessionmem_infra.serving`` checked per request and the
listener's requests in flight counted (503 past ``max_connections``). What each layer enforces is in
docs/limits-launcher.md.
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
from granian.constants import HTTPModes, Interfaces
from granian.log import LogLevels
from granian.rsgi import Scope
from granian.server.embed import Server

from sessionmem_core.env import ServingLimits
from sessionmem_core.errors import Overloaded, SessionMemError
from sessionmem_infra.serving import RequestLimits, http1_settings, open_connections, respond_error

_LISTEN_TIMEOUT_SECONDS = 10.0


Handler = Callable[[Scope, HTTPProtocol], Awaitable[None]]


class RsgiApp(Protocol):
    async def __rsgi__(self, scope: Scope, proto: HTTPProtocol) -> None: ...


class ListenerLimits:
    """The serving limits of one listener (``sessionmem_infra.serving.RequestLimits``) and its count of
    requests in flight."""

    __slots__ = ("_limits", "in_flight", "requests")

    def __init__(self, limits: ServingLimits) -> None:
        self._limits = limits
        self.requests = RequestLimits(limits)
        self.in_flight = 0

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
        if self.in_flight >= self._limits.max_connections:
            raise Overloaded(f"more than {self._limits.max_connections} requests in flight")
        self.requests.check_head(scope.path, scope.query_string, scope.headers)

    async def read_body(self, scope: Scope, proto: HTTPProtocol) -> bytes:
        headers = scope.headers
        return await self.requests.read_body(proto, headers.get("content-length"), "transfer-encoding" in headers)


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
