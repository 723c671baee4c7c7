"""``sessionmem_infra.heap``, checked in fresh interpreters: it changes the garbage collector of the whole
process, which a test must not do to the test runner's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def _run(code: str, env: dict[str, str] | None = None) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_start_up_survivors_are_frozen_its_garbage_freed_and_later_cycles_still_collected() -> None:
    before, garbage_freed, kept_frozen, later_freed, thresholds = _run(
        """
        import gc, weakref
        from sessionmem_infra.heap import settle_heap

        class Node:
            pass

        def cycle():
            node = Node()
            node.self = node
            return node

        kept = [cycle() for _ in range(1000)]
        garbage = weakref.ref(cycle())  # unreachable already: start-up's garbage
        before = gc.get_freeze_count()
        settle_heap((1234, 5, 6))
        collectable = {id(o) for o in gc.get_objects()}
        later = weakref.ref(cycle())
        gc.collect()
        print(before, garbage() is None, not any(id(k) in collectable for k in kept), later() is None,
              ",".join(map(str, gc.get_threshold())))
        """
    )
    assert before == "0"
    assert garbage_freed == "True", "start-up's garbage is collected before the freeze, not frozen for good"
    assert kept_frozen == "True", "what start-up keeps is out of every collection"
    assert later_freed == "True", "cycles made after the freeze are still collected"
    assert thresholds == "1234,5,6"


def test_each_proxy_worker_freezes_its_app_and_collects_young_objects_seldom() -> None:
    # The factory granian calls in each worker (the Valkey client connects on its first command), then
    # a worker's life: requests allocating containers, some in flight across each collection.
    frozen, app_collectable, allocations, young = _run(
        """
        import gc
        from collections import Counter, deque
        from sessionmem_proxy.app import app_from_env

        app = app_from_env()
        runs = Counter()
        gc.callbacks.append(lambda phase, info: phase == "start" and runs.update([info["generation"]]))
        in_flight = deque(maxlen=64)
        allocations = 200000
        for _ in range(allocations // 2):
            cycle = [{}]  # two containers, freed only by a collection
            cycle[0]["self"] = cycle
            in_flight.append(cycle)
        print(gc.get_freeze_count() > 0, any(o is app for o in gc.get_objects()), allocations, runs[0])
        """,
        {"SESSIONMEM_AUTH_MODE": "dev", "SESSIONMEM_VALKEY_URL": "redis://127.0.0.1:9"},
    )
    assert frozen == "True"
    assert app_collectable == "False", "the app is out of every collection"
    # CPython's default would be one young collection per 700 net allocations (~285 here).
    assert int(young) * 5000 <= int(allocations), f"{young} young collections for {allocations} allocations"
