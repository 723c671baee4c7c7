"""The explicit development identity: ``dev:<namespace>/<agent>[@<registry>]`` bearer tokens.

Only a proxy started with ``SESSIONMEM_AUTH_MODE=dev`` accepts them (never the default, never set by the
chart); local stacks, tests and benchmarks mint them here, so none of them imports the proxy to do it.
"""

from __future__ import annotations

DEV_TOKEN_PREFIX = "dev:"


def dev_token(namespace: str, agent: str, registry: str | None = None) -> str:
    """A development credential: only accepted by a proxy started with the explicit dev auth mode."""
    suffix = f"@{registry}" if registry else ""
    return f"{DEV_TOKEN_PREFIX}{namespace}/{agent}{suffix}"
