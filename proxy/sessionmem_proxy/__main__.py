"""``python -m sessionmem_proxy``: serve the proxy with uvicorn, settings from the environment."""

from __future__ import annotations

import argparse
import os

import uvicorn

from sessionmem_core.env import ProxySettings


def main() -> None:
    parser = argparse.ArgumentParser(description="sessionmem state-layer proxy")
    parser.add_argument("--workers", type=int, default=int(os.environ.get("SESSIONMEM_PROXY_WORKERS", "1")))
    args = parser.parse_args()
    settings = ProxySettings.from_env()
    uvicorn.run(
        "sessionmem_proxy.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=args.workers,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


if __name__ == "__main__":
    main()
