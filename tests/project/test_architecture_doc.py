"""docs/architecture.md stays the map of the tree: every file it names exists, and its test map lists
exactly the folders that hold tests."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
COMPONENTS = ("core", "infra", "proxy", "launcher", "operator", "client", "demo")


def _named_files(text: str) -> set[str]:
    return set(re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.(?:py|json|md))`", text))


def _exists(named: str) -> bool:
    # A component's modules may be named short: `proxy/store.py` for proxy/sessionmem_proxy/store.py.
    folder, _, rest = named.partition("/")
    short = REPO / folder / f"sessionmem_{folder}" / rest if folder in COMPONENTS else None
    return (REPO / named).exists() or (short is not None and short.exists())


def test_every_file_the_architecture_names_exists() -> None:
    named = _named_files(DOC.read_text())
    assert len(named) >= 20, "the architecture names the files of the data path"
    assert sorted(n for n in named if not _exists(n)) == []


def test_the_test_map_lists_every_test_folder() -> None:
    section = DOC.read_text().split("## Where the tests are", 1)[1]
    listed = set(re.findall(r"^\| `tests/([a-z0-9_]+)` \|", section, re.MULTILINE))
    folders = {p.parent.name for p in (REPO / "tests").glob("*/*.py")}
    assert listed == folders
    assert not list((REPO / "tests").glob("test_*.py")), "tests live in a component's folder"
