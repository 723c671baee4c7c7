"""Deadlines: timeouts of one length on one loop timer behave as ``asyncio.timeout`` does, on the
standard loop and on uvloop (the one granian runs the proxy and the launcher on)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import uvloop

from sessionmem_infra.serving import Deadlines

SHORT = 0.05
NEVER = 30.0  # far past SHORT; a broken timeout ends the test in "done" instead of hanging

Run = Callable[[Callable[[], Coroutine[Any, Any, Any]]], Any]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    factory = uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop

    def runner(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        with asyncio.Runner(loop_factory=factory) as r:
            return r.run(main())

    return runner


async def _outcome(deadlines: Deadlines, work: Callable[[], Awaitable[Any]]) -> str:
    try:
        with deadlines.timeout():
            await work()
    except TimeoutError:
        return "timeout"
    return "done"


def test_a_wait_past_its_deadline_raises_timeout_error(run: Run) -> None:
    deadlines = Deadlines(SHORT)

    async def main() -> tuple[str, int]:
        return await _outcome(deadlines, lambda: asyncio.sleep(NEVER)), deadlines.waiting

    assert run(main) == ("timeout", 0)


def test_a_wait_done_in_time_is_left_alone_and_forgotten(run: Run) -> None:
    deadlines = Deadlines(NEVER)

    async def main() -> tuple[str, int]:
        with deadlines.timeout() as wait:
            await asyncio.sleep(0)
        return ("expired" if wait.expired else "done"), deadlines.waiting

    assert run(main) == ("done", 0)


def test_of_many_concurrent_waits_only_the_stuck_ones_time_out(run: Run) -> None:
    deadlines = Deadlines(SHORT)

    async def main() -> list[str]:
        quick = [asyncio.create_task(_outcome(deadlines, lambda: asyncio.sleep(0))) for _ in range(50)]
        stuck = [asyncio.create_task(_outcome(deadlines, lambda: asyncio.sleep(NEVER))) for _ in range(50)]
        return await asyncio.gather(*quick, *stuck)

    assert run(main) == ["done"] * 50 + ["timeout"] * 50


def test_a_wait_begun_after_the_timer_was_armed_still_expires(run: Run) -> None:
    """The timer is armed for the first wait; that wait ends, and the timer, when it fires, re-arms for
    the wait begun later instead of lapsing."""
    deadlines = Deadlines(SHORT)

    async def main() -> tuple[str, str]:
        first = await _outcome(deadlines, lambda: asyncio.sleep(0))
        await asyncio.sleep(SHORT / 2)
        later = await _outcome(deadlines, lambda: asyncio.sleep(NEVER))
        return first, later

    assert run(main) == ("done", "timeout")


def test_a_cancellation_from_outside_propagates_as_cancellation(run: Run) -> None:
    deadlines = Deadlines(NEVER)

    async def main() -> tuple[bool, int]:
        task = asyncio.create_task(_outcome(deadlines, lambda: asyncio.sleep(NEVER)))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True, deadlines.waiting
        return False, deadlines.waiting

    assert run(main) == (True, 0)


def test_an_outside_cancellation_that_meets_the_deadline_stays_a_cancellation(run: Run) -> None:
    """As with asyncio.timeout: when the task is also cancelled from outside, the block does not swallow
    that cancellation into a TimeoutError."""
    deadlines = Deadlines(NEVER)

    async def main() -> str:
        started = asyncio.Event()
        waits = []

        async def worker() -> str:
            with deadlines.timeout() as wait:
                waits.append(wait)
                started.set()
                await asyncio.sleep(NEVER)
            return "done"

        task = asyncio.create_task(worker())
        await started.wait()
        waits[0].expire()  # the deadline passes ...
        task.cancel()  # ... and the request is cancelled from outside in the same turn
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        except TimeoutError:
            return "timeout"
        return "done"

    assert run(main) == "cancelled"


def test_one_deadlines_serves_successive_loops(run: Run) -> None:
    """A worker's limits outlive a loop in tests (and a restarted loop): the second loop's waits expire."""
    deadlines = Deadlines(SHORT)

    async def main() -> str:
        return await _outcome(deadlines, lambda: asyncio.sleep(NEVER))

    assert [run(main), run(main)] == ["timeout", "timeout"]


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("nan")])
def test_a_timeout_must_be_positive(seconds: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        Deadlines(seconds)
