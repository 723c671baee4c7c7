"""The architecture as a test: contract <- infrastructure <- components, and no component imports another.

docs/architecture.md draws the same picture; this reads every import statement of the shipped packages
(module level and inside functions alike) and fails on any edge the picture does not have.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# package -> (its folder, the sessionmem packages it may import besides itself)
CONTRACT = "sessionmem_core"
INFRA = "sessionmem_infra"
LAYERS: dict[str, tuple[str, frozenset[str]]] = {
    CONTRACT: ("core", frozenset()),
    INFRA: ("infra", frozenset({CONTRACT})),
    "sessionmem_proxy": ("proxy", frozenset({CONTRACT, INFRA})),
    "sessionmem_launcher": ("launcher", frozenset({CONTRACT, INFRA})),
    "sessionmem_operator": ("operator", frozenset({CONTRACT, INFRA})),
    "sessionmem_client": ("client", frozenset({CONTRACT, INFRA})),
    "sessionmem_demo": ("demo", frozenset({CONTRACT, INFRA})),
}
# The contract does no I/O of its own: no sockets, servers, clients or event loops.
CONTRACT_FORBIDDEN = frozenset(
    {"asyncio", "socket", "ssl", "httpx", "httptools", "uvloop", "granian", "valkey", "kopf", "kubernetes_asyncio"}
)


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def _sources(package: str) -> list[Path]:
    folder, _ = LAYERS[package]
    return sorted((REPO / folder / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_package_imports_only_the_layers_below_it(package: str) -> None:
    allowed = LAYERS[package][1] | {package}
    sources = _sources(package)
    assert sources, f"{package} has no sources where the layer table says"
    wrong = {
        f"{path.relative_to(REPO)} imports {root}"
        for path in sources
        for root in imported_roots(path)
        if root.startswith("sessionmem_") and root not in allowed
    }
    assert not wrong, sorted(wrong)


def test_the_contract_does_no_io() -> None:
    wrong = {
        f"{path.relative_to(REPO)} imports {root}"
        for path in _sources(CONTRACT)
        for root in imported_roots(path)
        if root in CONTRACT_FORBIDDEN
    }
    assert not wrong, sorted(wrong)


def test_the_checker_sees_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from sessionmem_proxy.app import create_app\n    import valkey.asyncio\n")
    assert imported_roots(source) == {"sessionmem_proxy", "valkey"}
