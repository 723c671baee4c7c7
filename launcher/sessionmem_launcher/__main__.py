"""``python -m sessionmem_launcher``: the launcher of an agent pod, configured by the operator's env."""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from collections.abc import Sequence

from sessionmem_core import env
from sessionmem_core.env import ConfigError, LauncherSettings

# Collections by generation: a young one every 700 net allocations, the middle one every 3rd, a full one
# every 2nd of those. Affordable only because ``bound_garbage_lifetime`` froze what start-up allocated.
GC_THRESHOLDS = (700, 2, 1)


def bound_garbage_lifetime() -> None:
    """Free reference cycles soon after their request instead of in bursts, once the launcher is up.

    Under the benchmark's 64-connection load, cycles that outlive a request (an HTTP parser and the
    object it calls back, holding a response's body chunks) survive into the oldest generation, and
    CPython's defaults run a full collection only once those pending exceed a quarter of all long-lived
    objects, about 20 thousand of which are start-up's: thousands of cycles waited, peak RSS rose 13 MiB
    over start and the heap kept 6-7 MiB of it. Freezing start-up's objects takes them out of every
    collection, so a full one scans only what requests left behind and can run often."""
    gc.collect()  # start-up's own garbage first: a frozen cycle is never freed
    gc.freeze()
    # A full collection runs only while the objects promoted since the last one are at least a quarter of
    # those it left behind; that count is taken again here, now without the frozen ones.
    gc.collect()
    gc.set_threshold(*GC_THRESHOLDS)


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sessionmem_launcher",
        description=(
            "The sessionmem launcher of an agent pod: the agent's memory endpoint on "
            f"127.0.0.1:${env.LAUNCHER_PORT} and the managed loop on ${env.SERVE_PORT}, forwarding every "
            f"memory call to the state-layer proxy at ${env.PROXY_URL} with the pod's token. "
            "It takes no arguments: the operator configures it through the environment."
        ),
        epilog=(
            f"Required: {env.PROXY_URL}. Serving limits: {env.MAX_HEADER_BYTES}, {env.MAX_HEADER_COUNT}, "
            f"{env.MAX_URL_BYTES}, {env.MAX_REQUEST_BODY_BYTES}, {env.HEADER_TIMEOUT_SECONDS}, "
            f"{env.BODY_TIMEOUT_SECONDS}, {env.IDLE_TIMEOUT_SECONDS}, {env.MAX_CONNECTIONS} "
            "(docs/limits-launcher.md)."
        ),
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    parse_arguments(argv)
    from sessionmem_launcher.server import Launcher

    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency of sessionmem
        pass
    try:
        launcher = Launcher(LauncherSettings.from_env())
        asyncio.run(launcher.run_until_signalled(started=bound_garbage_lifetime))
    except ConfigError as exc:  # a malformed setting, or no proxy URL: refused before anything listens
        sys.exit(f"sessionmem-launcher: {exc}")


if __name__ == "__main__":
    main()
