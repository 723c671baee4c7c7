"""``python -m sessionmem_proxy``: serve the proxy, settings from the environment (see ``server``)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from sessionmem_core.env import ProxySettings
from sessionmem_proxy.server import run_worker, supervise


def main() -> None:
    parser = argparse.ArgumentParser(description="sessionmem state-layer proxy")
    parser.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("SESSIONMEM_PROXY_WORKERS", "1")),
        help="worker processes (default 1, or SESSIONMEM_PROXY_WORKERS)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one of a supervisor's workers
    args = parser.parse_args()
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ProxySettings.from_env()
    if args.worker or args.workers == 1:
        run_worker(settings, reuse_port=args.worker)
        return
    sys.exit(supervise(args.workers))


if __name__ == "__main__":
    main()
