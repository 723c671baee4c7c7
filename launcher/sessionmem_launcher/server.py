"""Runs the launcher's two listeners in one event loop: the memory endpoint on 127.0.0.1 (reachable
only from inside the pod) and the managed loop on the pod's serving port."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import uvicorn
from opentelemetry.trace import TracerProvider

from sessionmem_core.env import LauncherSettings
from sessionmem_core.telemetry import MemoryTracer, tracer_provider_from_env
from sessionmem_launcher.managed_loop import ManagedLoop
from sessionmem_launcher.memory_api import MemoryEndpoint
from sessionmem_launcher.memory_client import MemoryClient, memory_client_from_settings

if TYPE_CHECKING:  # the launcher does not import Starlette at run time
    from starlette.types import ASGIApp


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signals alone: several share one process (and one test process),
    so whoever owns the process handles SIGTERM, once, for all of them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@dataclass
class Launcher:
    settings: LauncherSettings
    tracer_provider: TracerProvider | None = None
    memory_client: MemoryClient | None = None
    serve_host: str = "0.0.0.0"
    _servers: list[EmbeddedServer] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _loop_app: ManagedLoop | None = None

    async def start(self) -> None:
        tracer = MemoryTracer(self.tracer_provider or tracer_provider_from_env("sessionmem-launcher"), "launcher")
        client = self.memory_client or memory_client_from_settings(self.settings)
        self.memory_client = client
        self._loop_app = ManagedLoop(self.settings, client, tracer)
        apps: list[tuple[ASGIApp, str, int]] = [
            (MemoryEndpoint(client, tracer), "127.0.0.1", self.settings.launcher_port),
            (self._loop_app, self.serve_host, self.settings.serve_port),
        ]
        for app, host, port in apps:
            config = uvicorn.Config(
                app,
                host=host,
                port=port,
                lifespan="off",
                log_level="warning",
                access_log=False,
                loop="none",
                http="httptools",
                timeout_keep_alive=75,
            )
            server = EmbeddedServer(config)
            self._servers.append(server)
            self._tasks.append(asyncio.create_task(server.serve()))
        while not all(s.started for s in self._servers):
            if any(t.done() for t in self._tasks):
                for t in self._tasks:
                    if t.done() and t.exception():
                        raise RuntimeError("launcher failed to start") from t.exception()
                raise RuntimeError("launcher failed to start (port in use?)")
            await asyncio.sleep(0.005)

    @property
    def memory_port(self) -> int:
        return _bound_port(self._servers[0])

    @property
    def serve_port(self) -> int:
        return _bound_port(self._servers[1])

    async def stop(self) -> None:
        for server in self._servers:
            server.should_exit = True
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._loop_app is not None:
            await self._loop_app.aclose()
        if self.memory_client is not None:
            await self.memory_client.aclose()

    async def run_until_signalled(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await self.stop()


async def serve_in_background(
    app: ASGIApp, host: str = "127.0.0.1", port: int = 0
) -> tuple[EmbeddedServer, asyncio.Task[None], int]:
    """Start ``app`` on the running loop; returns the server, its task and the bound port."""
    server = EmbeddedServer(uvicorn.Config(app, host=host, port=port, lifespan="off", log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            raise RuntimeError(f"server on {host}:{port} failed to start")
        await asyncio.sleep(0.005)
    return server, task, _bound_port(server)


def _bound_port(server: uvicorn.Server) -> int:
    for sock in server.servers[0].sockets:
        return int(sock.getsockname()[1])
    raise RuntimeError("server has no socket")
