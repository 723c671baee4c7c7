"""How the proxy's workers and the launcher set up the cyclic garbage collector once they are ready to serve.

A server process holds a large heap for as long as it lives (modules, pydantic's validators, the app and
its clients), and allocates short-lived containers on every request (dicts, tuples, frames, futures).
Those allocations trigger collections: a young one traverses the new objects and everything the requests
in flight hold, a full one every tracked object, start-up's heap included. Under load that traversal was
a measurable share of the proxy's CPU per request (perf, docs/benchmarks.md). Frozen objects are never
traversed again; what is allocated afterwards is collected as before, at the process's own thresholds.
"""

from __future__ import annotations

import gc


def settle_heap(thresholds: tuple[int, int, int]) -> None:
    """Collect start-up's garbage, freeze what survives (``gc.freeze``), then collect at ``thresholds``
    (``gc.set_threshold``). Call once, when the process is ready to serve: a frozen object is never
    freed, so only what lives as long as the process may be frozen, and start-up's garbage goes first
    (a frozen cycle would never be collected)."""
    gc.collect()
    gc.freeze()
    # A full collection runs only once the objects promoted since the last one are a quarter of those it
    # left behind; that count is taken again here, without the frozen ones, or the first full collection
    # would wait for a quarter of start-up's heap.
    gc.collect()
    gc.set_threshold(*thresholds)
