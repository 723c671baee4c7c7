"""``python -m sessionmem_proxy``: serve the proxy, settings from the environment (see ``server``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from opentelemetry.trace import NoOpTracerProvider

from sessionmem_core.env import ConfigError, ProxySettings
from sessionmem_proxy.app import create_app
from sessionmem_proxy.server import serve

_LOG = logging.getLogger("sessionmem.proxy")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sessionmem_proxy",
        description="sessionmem state-layer proxy (settings from SESSIONMEM_* variables)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("SESSIONMEM_PROXY_WORKERS", "1")),
        help="worker processes (default 1, or SESSIONMEM_PROXY_WORKERS)",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = ProxySettings.from_env()
        # Built once here so a bad setting (a missing key file, a bad redactor pattern) stops the proxy at
        # start-up with its message, instead of failing in every worker.
        asyncio.run(create_app(settings, tracer_provider=NoOpTracerProvider()).aclose())
    except (ConfigError, OSError, ValueError) as exc:
        _LOG.error("bad configuration at start-up: %s", exc)
        sys.exit(2)
    try:
        serve(settings, args.workers)
    except (OSError, RuntimeError) as exc:  # granian reports a taken port as a RuntimeError
        _LOG.error("cannot serve on %s:%d at start-up: %s", settings.host, settings.port, exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
