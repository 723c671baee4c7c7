"""Serving the proxy: the FastAPI app on the project's small HTTP server, in one or more worker processes.

Why not uvicorn: per request, uvicorn's protocol layer alone costs more CPU than the proxy's whole read
(docs/benchmarks.md). The proxy's HTTP server (``sessionmem_core.http_server``) hands the two per-turn
operations straight to ``HotRoutes`` and everything else to the FastAPI app over ASGI, so every other
route, the OpenAPI document and the error handlers are the framework's as before.

Workers: each worker is a process with its own listening socket on the same port (``SO_REUSEPORT``), so
the kernel spreads connections over the workers; with one shared socket, a burst of connects from a
keep-alive client went (nearly) all to whichever worker woke first, and stayed there.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from sessionmem_core.env import MAX_BODY_BYTES, ProxySettings
from sessionmem_core.http_server import HttpServer
from sessionmem_proxy.app import create_app
from sessionmem_proxy.context import ProxyContext
from sessionmem_proxy.hot import HotRoutes

_LOG = logging.getLogger("sessionmem.proxy")
GRACE_SECONDS = 10.0
# A worker that dies this soon after it started, before any worker ever ran longer, is a configuration
# problem (port taken, bad settings): restarting it would only hide it, so the proxy exits (fail closed).
_EARLY_EXIT_SECONDS = 5.0
_RESTART_DELAY_SECONDS = 1.0


async def serve(
    settings: ProxySettings, reuse_port: bool = False, on_ready: Callable[[HttpServer], None] | None = None
) -> None:
    """Serve until SIGTERM or SIGINT, then finish the requests under way (bounded) and close."""
    app = create_app(settings)
    ctx: ProxyContext = app.state.ctx
    async with app.router.lifespan_context(app):
        server = HttpServer(app, MAX_BODY_BYTES, router=HotRoutes(ctx))
        await server.start(settings.host, settings.port, reuse_port=reuse_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if on_ready is not None:
            on_ready(server)
        await stop.wait()
        await server.stop(GRACE_SECONDS)


def run_worker(settings: ProxySettings, reuse_port: bool) -> None:
    import uvloop  # a dependency of uvicorn[standard]; only the serving process needs it

    uvloop.run(serve(settings, reuse_port))


def supervise(workers: int) -> int:
    """Run ``workers`` worker processes, restart one that dies, and stop them all on SIGTERM/SIGINT."""
    command = [sys.executable, "-m", "sessionmem_proxy", "--worker"]
    stopping = False
    children: list[subprocess.Popen[bytes]] = []

    def on_signal(signum: int, _: object) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    children += [subprocess.Popen(command) for _ in range(workers)]
    ever_settled = False
    while not stopping:
        time.sleep(0.2)
        ever_settled = ever_settled or time.monotonic() - started > _EARLY_EXIT_SECONDS
        for index, child in enumerate(children):
            code = child.poll()
            if code is None or stopping:
                continue
            if not ever_settled:
                _LOG.error("proxy worker exited with %s at start-up; stopping", code)
                on_signal(signal.SIGTERM, None)
                _wait_all(children)
                return code or 1
            _LOG.warning("proxy worker exited with %s; starting another", code)
            time.sleep(_RESTART_DELAY_SECONDS)
            children[index] = subprocess.Popen(command)
    _wait_all(children)
    return 0


def _wait_all(children: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + GRACE_SECONDS + 5.0
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
