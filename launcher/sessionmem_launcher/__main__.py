"""``python -m sessionmem_launcher``: the launcher of an agent pod, configured by the operator's env."""

from __future__ import annotations

import asyncio
import sys

from sessionmem_core.env import ConfigError, LauncherSettings
from sessionmem_launcher.server import Launcher


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
    asyncio.run(Launcher(settings).run_until_signalled())


if __name__ == "__main__":
    main()
