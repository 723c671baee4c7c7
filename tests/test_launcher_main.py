"""``python -m sessionmem_launcher``'s process-wide settings, checked in a fresh interpreter (they change
the garbage collector of the whole process, which a test must not do to the test runner's)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_cycles_left_by_requests_get_full_collections_despite_many_long_lived_objects() -> None:
    # Start-up leaves tens of thousands of long-lived objects; with CPython's defaults a full collection
    # then waits until a quarter as many have been promoted, and cycles that outlived their request
    # (held in flight across a young collection) pile up until then.
    code = textwrap.dedent(
        """
        import gc
        from collections import Counter, deque
        from sessionmem_launcher.__main__ import bound_garbage_lifetime

        start_up = [{"n": [n]} for n in range(15000)]
        bound_garbage_lifetime()
        runs = Counter()
        gc.callbacks.append(lambda phase, info: phase == "start" and runs.update([info["generation"]]))
        in_flight = deque(maxlen=64)
        for _ in range(100000):
            cycle = [{}]
            cycle[0]["self"] = cycle
            in_flight.append(cycle)
        print(runs[0], runs[2], gc.get_freeze_count() >= len(start_up))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    young, full, frozen = result.stdout.split()
    assert frozen == "True", "start-up's objects are out of every collection"
    assert int(full) * 10 >= int(young), f"{full} full collections for {young} young ones"
