"""Serving for tests: an app (RSGI, or ASGI without lifespan) served in the test's own event loop by
granian's embedded server, on port 0 when asked (the port is read back), and an httpx client to it.

Binding port 0 takes granian's private socket holder (``_BoundServer``): product code serves on the
ports it is configured with (``sessionmem_launcher.serving``), so this lives here, with the tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
from granian._granian import ListenerSpec
from granian.constants import HTTPModes, Interfaces
from granian.log import LogLevels
from granian.server.embed import Server

from sessionmem_core.env import ServingLimits
from sessionmem_infra.serving import http1_settings, open_connections

_LISTEN_TIMEOUT_SECONDS = 10.0


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


class TestServer:
    """One listening port (any free one for port 0) served by granian on the running loop until ``stop()``."""

    __test__ = False  # not a test class

    def __init__(self, app: Any, host: str, port: int, limits: ServingLimits, interface: Interfaces) -> None:
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
) -> TestServer:
    """Serve ``app`` on the running loop until ``stop()``; ``port`` 0 picks a free one (see ``.port``).
    An object with ``__rsgi__`` is served as RSGI, anything else as an ASGI app without lifespan. Also the
    ``serve`` a test hands ``sessionmem_launcher.server.Launcher`` to start it on port 0."""
    if interface is None:
        interface = Interfaces.RSGI if hasattr(app, "__rsgi__") else Interfaces.ASGINL
    server = TestServer(app, host, port, limits or ServingLimits(), interface)
    await server.start()
    return server


@contextlib.asynccontextmanager
async def served_client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    server = await serve_in_background(app)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            yield client
    finally:
        await server.stop()
