"""constraints.txt pins every package of the development environment; the requirements files name what
sessionmem needs. They must agree, or pip refuses the install: each requirement is in the constraints at
the version the requirement pins, and every constraint is an exact pin."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(==\s*(\S+))?")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(path: Path) -> dict[str, str | None]:
    """Name -> pinned version (None when unpinned), following ``-r`` includes."""
    found: dict[str, str | None] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            found.update(_requirements(path.parent / line[3:].strip()))
            continue
        match = _NAME.match(line)
        assert match, f"{path.name}: unreadable line {raw!r}"
        found[_normalized(match.group(1))] = match.group(4)
    return found


def _constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if not raw or raw.startswith("#"):
            continue
        name, sep, version = raw.partition("==")
        assert sep and version and " " not in raw, f"constraints.txt: not an exact pin: {raw!r}"
        pins[_normalized(name)] = version
    return pins


def test_every_requirement_is_constrained_at_its_own_pin() -> None:
    constraints = _constraints()
    for requirements in ("requirements-dev.txt", "requirements-bench.txt"):
        for name, version in _requirements(REPO / requirements).items():
            assert name in constraints, f"{requirements}: {name} is not in constraints.txt (make constraints)"
            assert version in (None, constraints[name]), (
                f"{requirements} pins {name}=={version}, constraints.txt {constraints[name]} (make constraints)"
            )


def test_the_runtime_requirements_are_all_pinned() -> None:
    unpinned = [name for name, version in _requirements(REPO / "requirements.txt").items() if version is None]
    assert unpinned == []
