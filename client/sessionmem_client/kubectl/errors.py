"""What the plugin tells a person when it cannot do what they asked."""

from __future__ import annotations


class PluginError(Exception):
    """Printed as ``error: <message>`` with exit status 1; ``title`` replaces ``error`` (``Forbidden``)."""

    def __init__(self, message: str, title: str = "error") -> None:
        super().__init__(message)
        self.message = message
        self.title = title

    def __str__(self) -> str:
        return f"{self.title}: {self.message}"
