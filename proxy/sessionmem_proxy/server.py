"""Serving the proxy on granian (Rust/hyper): its HTTP/1.1 connection handling, pipelining, head limits
and timeouts, and its worker processes (each worker a process of its own, restarted if it dies; SIGTERM
or SIGINT stops them all gracefully).

What granian enforces and what the app does is in docs/limits.md.
"""

from __future__ import annotations

import logging

from granian.constants import HTTPModes, Interfaces
from granian.log import LogLevels
from granian.server.mp import MPServer

from sessionmem_core.env import ProxySettings
from sessionmem_infra.serving import http1_settings, open_connections

APP_FACTORY = "sessionmem_proxy.app:app_from_env"
GRACE_SECONDS = 10
_LOG = logging.getLogger("sessionmem.proxy")


def granian_server(settings: ProxySettings, workers: int) -> MPServer:
    return MPServer(
        APP_FACTORY,
        address=settings.host,
        port=settings.port,
        interface=Interfaces.RSGI,
        workers=workers,
        factory=True,
        # HTTP/1.1 only: every limit in docs/limits.md holds there; HTTP/2 would need limits of its own.
        http=HTTPModes.http1,
        websockets=False,
        backlog=2048,
        # Above the app's own request limit, so an excess request reaches the app and is answered 503
        # instead of waiting unseen.
        backpressure=open_connections(settings.limits),
        http1_settings=http1_settings(settings.limits),
        log_level=LogLevels.warning,
        respawn_failed_workers=True,
        workers_kill_timeout=GRACE_SECONDS,
    )


def serve(settings: ProxySettings, workers: int) -> None:
    """Serve until SIGTERM or SIGINT; granian exits non-zero when its workers cannot start."""
    granian_server(settings, workers).serve()
