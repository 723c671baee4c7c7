"""A memory backend's state as one process sees it, logged when it changes: one line when it goes down
(with its address and the cause) and one when it is back, never one per failed call.

The proxy follows Valkey with it (its readiness and every conversation operation), the launcher follows
the proxy (every forwarded call). Without it, memory could be down for minutes with every answer a 503
and nothing in the log saying where or why.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit, urlunsplit


def display_address(url: str) -> str:
    """The URL without its credentials (a Valkey URL may carry a password) and without its query."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class BackendState:
    """Up until a call says otherwise. ``is_down`` is a plain attribute: the hot paths read it on every
    successful operation and call ``up`` only when it is set, so a healthy backend costs them no call."""

    __slots__ = ("_address", "_logger", "_what", "is_down")

    def __init__(self, logger: logging.Logger, what: str, address: str) -> None:
        self._logger = logger
        self._what = what
        self._address = display_address(address)
        self.is_down = False

    def down(self, cause: str) -> None:
        if not self.is_down:
            self.is_down = True
            self._logger.warning("%s at %s is down: %s", self._what, self._address, cause)

    def up(self) -> None:
        if self.is_down:
            self.is_down = False
            self._logger.warning("%s at %s is up again", self._what, self._address)


def cause_of(exc: BaseException) -> str:
    """The error and what raised it, e.g. ``memory backend unavailable: TimeoutError (Timeout reading from
    socket)``: the typed message alone often names only the exception class."""
    cause = exc.__cause__
    text = str(exc) or type(exc).__name__
    if cause is not None and str(cause) and str(cause) not in text:
        return f"{text} ({cause})"
    return text
