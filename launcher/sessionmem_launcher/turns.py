"""Turn handles: what the agent process gets instead of the end user's capability.

The caller (the BFF) sends the user's signed capability to the serving port. The launcher keeps it in this
process, binds a fresh opaque handle to it for the one request it relays to the agent, and sends the agent
only that handle (``X-Sessionmem-Turn``). The agent's memory calls name the handle; the memory endpoint
resolves it to the capability while the binding lives. The binding is released when the agent's answer is
in (or the request fails), so a handle the agent kept, logged or leaked is worth nothing afterwards: a
compromised agent reaches at most the users whose turns it is serving, while they last.

Handles are random (256 bits), never derived from the capability, and held only in memory: a restart of
the launcher ends every turn with it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from sessionmem_core import api
from sessionmem_core.errors import Overloaded, TurnNotLive

# Tells a handle from a capability (``smc2.``) at a glance, in logs and in tests.
HANDLE_PREFIX = "smt1."
_HANDLE_BYTES = 32


class TurnBindings:
    """The live bindings handle -> capability, at most ``max_live`` at once (one per request in flight on
    the serving port, which admits no more than its connection limit)."""

    __slots__ = ("_live", "_max_live")

    def __init__(self, max_live: int) -> None:
        self._live: dict[str, str] = {}
        self._max_live = max_live

    def __len__(self) -> int:
        return len(self._live)

    @contextmanager
    def bound(self, capability: str) -> Iterator[str]:
        """A fresh handle bound to ``capability`` for the duration of the ``with`` block."""
        if len(self._live) >= self._max_live:
            raise Overloaded(f"more than {self._max_live} turns in flight")
        handle = HANDLE_PREFIX + secrets.token_urlsafe(_HANDLE_BYTES)
        self._live[handle] = capability
        try:
            yield handle
        finally:
            del self._live[handle]

    def resolve(self, handle: str) -> str:
        """The capability bound to ``handle``; TurnNotLive when no turn holds it (any more)."""
        capability = self._live.get(handle)
        if capability is None:
            raise TurnNotLive(
                f"the {api.TURN_HEADER} handle is not live: a handle is good only during its turn, until the "
                "agent answers the request it came with"
            )
        return capability
