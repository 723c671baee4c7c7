"""``python -m sessionmem_launcher``: the launcher of an agent pod, configured by the operator's env."""

from __future__ import annotations

import asyncio
import gc
import sys

from sessionmem_core.env import ConfigError, LauncherSettings
from sessionmem_launcher.server import Launcher

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


def main() -> None:
    try:
        settings = LauncherSettings.from_env()
    except ConfigError as exc:
        sys.exit(f"sessionmem-launcher: {exc}")
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        pass
    asyncio.run(Launcher(settings).run_until_signalled(started=bound_garbage_lifetime))


if __name__ == "__main__":
    main()
