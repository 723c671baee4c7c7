"""bench.report's comparison with the baseline proxy: the interleaved rounds when a run has them (the
median of each round's own ratio), else the one run of each, else the stored baseline; and encryption at
rest off against on, round by round, against its budget."""

from __future__ import annotations

from typing import Any

import pytest

from bench.report import (
    BEFORE_TREE,
    SEALING_TREES,
    before_key,
    compare_sealing,
    compare_with_before,
    derive,
    interleaved_key,
    round_suffix,
    sealing_key,
    targets,
)

KEY, TREE = "proxy.w1.append.c64", "proxy-w1"


def _cpu(tree: str, value: float) -> dict[str, Any]:
    return {"cpu_us_per_request": {tree: value}}


def test_the_rounds_give_medians_and_the_median_of_their_own_ratios() -> None:
    rounds = {1: (100.0, 50.0), 2: (120.0, 80.0), 3: (90.0, 60.0)}  # ratios 2.0, 1.5, 1.5
    http = {KEY: _cpu(TREE, 500.0), before_key(KEY): _cpu(BEFORE_TREE, 1.0)}
    for n, (now, old) in rounds.items():
        http[interleaved_key(KEY) + round_suffix(n)] = _cpu(TREE, now)
        http[before_key(KEY) + round_suffix(n)] = _cpu(BEFORE_TREE, old)

    seen = compare_with_before({"http": http}, {}, KEY, TREE)

    assert (seen.now, seen.before, seen.ratio, seen.in_run, seen.rounds) == (100.0, 60.0, 1.5, True, 3)


def test_without_rounds_the_single_runs_then_the_stored_baseline_are_used() -> None:
    single = {"http": {KEY: _cpu(TREE, 90.0), before_key(KEY): _cpu(BEFORE_TREE, 60.0)}}
    stored = {"http": {KEY: _cpu(TREE, 45.0)}}

    in_run = compare_with_before(single, stored, KEY, TREE)
    from_store = compare_with_before({"http": {KEY: _cpu(TREE, 90.0)}}, stored, KEY, TREE)

    assert in_run.ratio == pytest.approx(1.5)
    assert (in_run.in_run, in_run.rounds) == (True, 0)
    assert from_store.ratio == pytest.approx(2.0)
    assert (from_store.before, from_store.in_run) == (45.0, False)


def test_encryption_at_rest_is_compared_round_by_round_against_its_budget() -> None:
    http: dict[str, Any] = {}
    for n, (plain, sealed) in {1: (100.0, 110.0), 2: (80.0, 100.0), 3: (90.0, 99.0)}.items():  # 1.1, 1.25, 1.1
        http[sealing_key("off", "read") + round_suffix(n)] = _cpu(SEALING_TREES["off"], plain)
        http[sealing_key("on", "read") + round_suffix(n)] = _cpu(SEALING_TREES["on"], sealed)
    results = {"http": http}

    off, on, ratio, rounds = compare_sealing(results, "read")
    assert (off, on, rounds) == (90.0, 100.0, 3)
    assert ratio == pytest.approx(1.1)
    assert compare_sealing(results, "append") == (None, None, None, 0)
    derived = derive(results, {})
    met = {t.name: t.met for t in targets(results, derived) if "encryption at rest" in t.name}
    assert met == {
        "proxy CPU per read @64 conns, encryption at rest on / off": True,
        "proxy CPU per append @64 conns, encryption at rest on / off": None,
    }
