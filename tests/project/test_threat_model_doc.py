"""docs/threat-model.md backs every claim with a test: each test it names must exist, so a renamed or
deleted test cannot leave a claim standing on nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "threat-model.md"
# `file.py` or `file.py::test_name` (a trailing ... abbreviates a name shown in full elsewhere in the doc).
_REFERENCE = re.compile(r"`((?:[a-z_]+/)?test_[a-z0-9_]+\.py|(?:[a-z_]+/)?[a-z_]+\.py)(?:::([A-Za-z0-9_]+)(\.\.\.)?)?`")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
    }


def references() -> list[tuple[str, str | None, bool]]:
    return [(m[0], m[1] or None, bool(m[2])) for m in _REFERENCE.findall(DOC.read_text())]


def test_every_test_the_threat_model_names_exists() -> None:
    found = [r for r in references() if r[0].split("/")[-1].startswith("test_")]
    assert len(found) >= 20, "the threat model names its tests"
    missing = []
    for file, name, abbreviated in found:
        path = REPO / "tests" / file
        if not path.exists():
            missing.append(file)
        elif name is not None:
            names = _tests_in(path)
            if not (any(n.startswith(name) for n in names) if abbreviated else name in names):
                missing.append(f"{file}::{name}")
    assert missing == []


def test_the_checker_notices_a_missing_test(tmp_path: Path) -> None:
    source = tmp_path / "test_x.py"
    source.write_text("def test_a():\n    pass\n\nasync def test_b():\n    pass\n")
    assert _tests_in(source) == {"test_a", "test_b"}
