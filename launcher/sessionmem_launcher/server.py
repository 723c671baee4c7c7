"""Runs the launcher's two listeners in one event loop: the memory endpoint on 127.0.0.1 (reachable
only from inside the pod) and the managed loop on the pod's serving port."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.trace import TracerProvider

from sessionmem_core.env import MAX_BODY_BYTES, LauncherSettings
from sessionmem_core.http_server import AsgiApp, HttpServer, Router
from sessionmem_core.telemetry import MemoryTracer, tracer_provider_from_env
from sessionmem_launcher.managed_loop import ManagedLoop
from sessionmem_launcher.memory_api import MemoryEndpoint
from sessionmem_launcher.memory_client import MemoryClient, memory_client_from_settings


@dataclass
class Launcher:
    settings: LauncherSettings
    tracer_provider: TracerProvider | None = None
    memory_client: MemoryClient | None = None
    serve_host: str = "0.0.0.0"
    _servers: list[HttpServer] = field(default_factory=list)
    _loop_app: ManagedLoop | None = None

    async def start(self) -> None:
        tracer = MemoryTracer(self.tracer_provider or tracer_provider_from_env("sessionmem-launcher"), "launcher")
        client = self.memory_client or memory_client_from_settings(self.settings)
        self.memory_client = client
        self._loop_app = ManagedLoop(self.settings, client, tracer)
        endpoint = MemoryEndpoint(client, tracer)
        memory = await serve_in_background(endpoint, "127.0.0.1", self.settings.launcher_port, router=endpoint.route)
        self._servers.append(memory)
        self._servers.append(await serve_in_background(self._loop_app, self.serve_host, self.settings.serve_port))

    @property
    def memory_port(self) -> int:
        return self._servers[0].port

    @property
    def serve_port(self) -> int:
        return self._servers[1].port

    async def stop(self) -> None:
        await asyncio.gather(*(server.stop() for server in self._servers), return_exceptions=True)
        if self._loop_app is not None:
            await self._loop_app.aclose()
        if self.memory_client is not None:
            await self.memory_client.aclose()

    async def run_until_signalled(self, started: Callable[[], None] | None = None) -> None:
        """Serve until SIGTERM or SIGINT; ``started`` runs once both listeners are up."""
        await self.start()
        if started is not None:
            started()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await self.stop()


async def serve_in_background(
    app: AsgiApp,
    host: str = "127.0.0.1",
    port: int = 0,
    max_body: int = MAX_BODY_BYTES,
    router: Router | None = None,
) -> HttpServer:
    """Serve ``app`` on the running loop until ``stop()``; ``port`` 0 picks a free one (see ``.port``).
    Requests ``router`` claims skip ``app`` (see ``HttpServer``)."""
    server = HttpServer(app, max_body, router)
    await server.start(host, port)
    return server
