"""``python -m sessionmem_launcher``: the launcher of an agent pod, configured by the operator's env."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sessionmem_core import env
from sessionmem_core.env import ConfigError, LauncherSettings
from sessionmem_infra.heap import settle_heap

if TYPE_CHECKING:
    from sessionmem_launcher.server import Launcher

# Collections by generation: a young one every 700 net allocations, the middle one every 3rd, a full one
# every 2nd of those. Affordable only because ``bound_garbage_lifetime`` froze what start-up allocated.
GC_THRESHOLDS = (700, 2, 1)


# Modules granian imports when they are installed, for features its embedded server does not have
# (reloading on file changes, .env files, process titles): the image installs them for the proxy's sake.
_UNUSED_BY_EMBEDDED_GRANIAN = ("anyio", "dotenv", "watchfiles", "setproctitle")


def bound_garbage_lifetime() -> None:
    """Free reference cycles soon after their request instead of in bursts, once the launcher is up.

    Under load, cycles that outlive a request survive into the oldest generation, and CPython's defaults
    run a full collection only once those pending exceed a quarter of all long-lived objects, most of
    them start-up's: the cycles wait, and peak RSS grows with them (docs/benchmarks.md). Freezing
    start-up's objects takes them out of every collection, so a full one scans only what requests left
    behind and can run often."""
    settle_heap(GC_THRESHOLDS)


def import_launcher_with_small_granian() -> type[Launcher]:
    """Import the launcher (and granian) telling granian's allocator to keep little and letting granian skip
    its optional modules. Only for the launcher's own process (one per agent pod, under an RSS budget)."""
    os.environ.setdefault(env.GRANIAN_JEMALLOC_CONF, env.LAUNCHER_JEMALLOC_CONF)
    # A None entry makes ``import name`` raise ImportError, which granian takes for "not installed"; the
    # entries go again once granian is loaded, so other code (a token counter's module) imports them as usual.
    hidden = [name for name in _UNUSED_BY_EMBEDDED_GRANIAN if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        from sessionmem_launcher.server import Launcher
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]
    return Launcher


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
    launcher_class = import_launcher_with_small_granian()

    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency of sessionmem
        pass
    try:
        launcher = launcher_class(LauncherSettings.from_env())
        asyncio.run(launcher.run_until_signalled(started=bound_garbage_lifetime))
    except ConfigError as exc:  # a malformed setting, or no proxy URL: refused before anything listens
        sys.exit(f"sessionmem-launcher: {exc}")


if __name__ == "__main__":
    main()
