"""The test harness's pure helpers: a CRD read before the API server filled in its status must not crash
the CRD wait (it made cluster starts flaky under load)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.rest import crd_conditions


@pytest.mark.parametrize(
    "crd",
    [
        {"status": {"conditions": None}},
        {"status": None},
        {},
        {"status": {"conditions": "not-a-list"}},
        {"status": {"conditions": [None, {"status": "True"}]}},
    ],
    ids=["conditions-null", "status-null", "no-status", "conditions-not-a-list", "items-without-type"],
)
def test_a_crd_without_conditions_yet_has_none(crd: dict[str, Any]) -> None:
    assert crd_conditions(crd) == {}


def test_conditions_are_keyed_by_type() -> None:
    established = {"type": "Established", "status": "True"}
    names = {"type": "NamesAccepted", "status": "True"}
    assert crd_conditions({"status": {"conditions": [established, names]}}) == {
        "Established": established,
        "NamesAccepted": names,
    }
