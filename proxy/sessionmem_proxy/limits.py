"""The worker's count of requests in flight (the serving limits of one request are
``sessionmem_infra.serving.RequestLimits``; docs/limits.md says which layer enforces which limit)."""

from __future__ import annotations


class InFlight:
    """Counts the requests a worker is serving; ``enter`` says False when it already serves its maximum
    (the caller answers 503 without reading the request)."""

    __slots__ = ("count", "maximum")

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.count = 0

    def enter(self) -> bool:
        if self.count >= self.maximum:
            return False
        self.count += 1
        return True

    def leave(self) -> None:
        self.count -= 1
