"""Runs the launcher's two listeners in one event loop, each a granian embedded server: the memory endpoint
on 127.0.0.1 (reachable only from inside the pod) and the managed loop on the pod's serving port."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.trace import TracerProvider

from sessionmem_core.env import LauncherSettings
from sessionmem_infra.telemetry import MemoryTracer, tracer_provider_from_env
from sessionmem_launcher.forward import Forwarder, forwarder_from_settings
from sessionmem_launcher.managed_loop import ManagedLoop
from sessionmem_launcher.serving import Listener, ListenerLimits, MemoryEndpoint, Serve, serve_in_background
from sessionmem_launcher.turns import TurnBindings


@dataclass
class Launcher:
    settings: LauncherSettings
    tracer_provider: TracerProvider | None = None
    serve_host: str = "0.0.0.0"
    # How each listener is opened (injected: a test serves on port 0 with its own, tests/support/serving.py).
    serve: Serve = serve_in_background
    _servers: list[Listener] = field(default_factory=list)
    _forwarder: Forwarder | None = None
    _loop_app: ManagedLoop | None = None
    # The handles of the turns in flight on the serving port, which the memory endpoint resolves.
    turns: TurnBindings = field(init=False)

    def __post_init__(self) -> None:
        self.turns = TurnBindings(self.settings.limits.max_connections)

    async def start(self) -> None:
        tracer = MemoryTracer(self.tracer_provider or tracer_provider_from_env("sessionmem-launcher"), "launcher")
        forwarder = forwarder_from_settings(self.settings, tracer)  # ConfigError without a proxy URL
        self._forwarder = forwarder
        limits = self.settings.limits
        endpoint = MemoryEndpoint(forwarder, ListenerLimits(limits), self.turns)
        self._loop_app = ManagedLoop(self.settings, forwarder, ListenerLimits(limits), self.turns)
        self._servers.append(await self.serve(endpoint, "127.0.0.1", self.settings.launcher_port, limits))
        self._servers.append(await self.serve(self._loop_app, self.serve_host, self.settings.serve_port, limits))

    @property
    def memory_port(self) -> int:
        return self._servers[0].port

    @property
    def serve_port(self) -> int:
        return self._servers[1].port

    async def stop(self) -> None:
        await asyncio.gather(*(server.stop() for server in self._servers), return_exceptions=True)
        self._servers.clear()
        if self._loop_app is not None:
            await self._loop_app.aclose()
        if self._forwarder is not None:
            await self._forwarder.aclose()

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
