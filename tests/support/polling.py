"""Waiting for a real system to get somewhere: poll, never sleep a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(probe: Callable[[], T | None], what: str, timeout: float, *, tolerate: tuple[type[Exception], ...] = ()) -> T:
    """Call ``probe`` until it answers something truthy and answer that; fail naming ``what`` (and the last
    answer) after ``timeout`` seconds. An exception in ``tolerate`` counts as no answer yet."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except tolerate:
            last = None
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r:.2000})")
