"""Fault tests are marked ``faults`` (``pytest -m "not faults"`` skips them); those that need the
Kubernetes control plane are also marked ``integration``."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: kills or pauses real processes under a bounded load")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/faults/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.faults)
