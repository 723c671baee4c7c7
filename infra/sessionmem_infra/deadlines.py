"""Timeouts of one length for many concurrent waits, on one event-loop timer.

``asyncio.timeout`` arms a loop timer when a wait starts and cancels it when the wait ends. On a path every
request takes (reading a request body), arming and cancelling that timer cost more CPU than the rest of the
read (docs/benchmarks.md). Deadlines of one length pass in the order they were set, so one timer, armed
for the oldest wait still under way, serves them all: starting a wait is a dict insertion, ending it a
removal, and the timer is re-armed only when it fires.

``Deadlines(seconds).timeout()`` is used as ``asyncio.timeout(seconds)`` is, with a plain ``with`` (entering
and leaving it awaits nothing): the block's task is cancelled once the deadline passes, the block then
raising TimeoutError. A cancellation
that is not the deadline's (the request's task cancelled from outside) propagates as it would.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

# The loop's timers fire to the millisecond: a wait due within this margin counts as passed when the timer
# fires, rather than re-arming a timer for a fraction of a millisecond.
_MARGIN_SECONDS = 0.001


class Deadlines:
    """The deadlines of the waits under way, oldest first, and the one timer that expires them."""

    __slots__ = ("_loop", "_pending", "_timer", "seconds")

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"a timeout must be positive, not {seconds!r}")
        self.seconds = seconds
        # Insertion order is deadline order (one length for all): the first key is the oldest wait.
        self._pending: dict[TaskTimeout, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def timeout(self) -> TaskTimeout:
        """A ``with`` block, in a task, that raises TimeoutError once ``seconds`` have passed since it began."""
        return TaskTimeout(self)

    @property
    def waiting(self) -> int:
        """How many waits are under way."""
        return len(self._pending)

    def _start(self, wait: TaskTimeout) -> float:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Another loop (a new worker's, a test's): the old loop's timer and waits are not this one's.
            self._loop, self._pending, self._timer = loop, {}, None
        deadline = loop.time() + self.seconds
        self._pending[wait] = None
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        return deadline

    def _end(self, wait: TaskTimeout) -> None:
        self._pending.pop(wait, None)

    def _expire(self) -> None:
        self._timer = None
        loop, pending = self._loop, self._pending
        assert loop is not None
        now = loop.time() + _MARGIN_SECONDS
        while pending:
            oldest = next(iter(pending))
            if oldest.deadline > now:
                self._timer = loop.call_at(oldest.deadline, self._expire)
                return
            del pending[oldest]
            oldest.expire()


class TaskTimeout:
    """One wait: cancels its task when its deadline passes, and turns that cancellation into TimeoutError."""

    __slots__ = ("_cancelling", "_deadlines", "_task", "deadline", "expired")

    def __init__(self, deadlines: Deadlines) -> None:
        self._deadlines = deadlines
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self.deadline = 0.0
        self.expired = False

    def __enter__(self) -> TaskTimeout:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a timeout needs a task to cancel")
        self._task = task
        self._cancelling = task.cancelling()
        self.deadline = self._deadlines._start(self)
        return self

    def expire(self) -> None:
        self.expired = True
        assert self._task is not None
        self._task.cancel()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._deadlines._end(self)
        if not self.expired:
            return
        assert self._task is not None
        # The same test asyncio.timeout makes: the cancellation is the deadline's only when no other
        # cancellation of the task is outstanding.
        if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError(f"not done within {self._deadlines.seconds:g} s") from exc
