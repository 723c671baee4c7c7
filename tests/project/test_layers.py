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


def _module_name(folder: str, path: Path) -> str:
    parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules among ``modules`` that a file imports, at module level, inside functions or under
    TYPE_CHECKING alike: ``from a import b`` is an import of the module ``a.b`` when there is one, else of
    ``a``. A package's ``__init__`` that a submodule's import runs is not counted (every module has one)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            named = [f"{node.module}.{alias.name}" for alias in node.names]
            found.update(name for name in named if name in modules)
            if node.module in modules and any(name not in modules for name in named):
                found.add(node.module)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (each holds an import cycle)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            group: list[str] = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return cycles


def import_graph(package: str) -> dict[str, set[str]]:
    folder, _ = LAYERS[package]
    files = {_module_name(folder, path): path for path in _sources(package)}
    return {name: module_imports(path, set(files)) - {name} for name, path in files.items()}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_import_cycle_inside_a_component(package: str) -> None:
    """A module that needs another's caller to be loaded first reads in no order: each component's modules
    form a hierarchy (function-level and TYPE_CHECKING imports count)."""
    assert import_cycles(import_graph(package)) == []


def test_the_cycle_finder_finds_cycles(tmp_path: Path) -> None:
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}, "p.e": set()}
    assert import_cycles(graph) == [["p.a", "p.b", "p.c"]]
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import Thing\n"
        "def f():\n    from p import b\n"
    )
    assert module_imports(source, {"p", "p.a", "p.b"}) == {"p.a", "p.b"}


# The builders of key layouts (sessionmem_core.keys): in the proxy only the key resolver of its admission step
# calls them (the one place a caller's request is given a layout); the rest of the proxy takes the key the
# admission step resolved, or the spaces and accounting keys sessionmem_core.keys derives from one.
KEY_BUILDERS = frozenset(
    {"session_prefix", "shared_prefix", "per_user_prefix", "session_key", "shared_key", "per_user_key",
     "usage_space", "usage_keys", "catalogue_keys", "KEY_PREFIX", "USAGE_PREFIX"}
)  # fmt: skip
KEY_MODULE = "proxy/sessionmem_proxy/admission.py"


def key_layout_uses(path: Path) -> set[str]:
    """The key builders of sessionmem_core.keys a file imports or reaches as ``keys.<name>``."""
    used: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "sessionmem_core.keys":
            used.update(alias.name for alias in node.names if alias.name in KEY_BUILDERS)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "keys":
            used.update({node.attr} & KEY_BUILDERS)
    return used


def test_the_proxy_builds_keys_in_one_module() -> None:
    builders = {
        str(path.relative_to(REPO)): sorted(used)
        for path in _sources("sessionmem_proxy")
        if (used := key_layout_uses(path))
    }
    assert list(builders) == [KEY_MODULE], builders
    literal_keys = {
        str(path.relative_to(REPO))
        for path in _sources("sessionmem_proxy")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("mem:")
    }
    assert literal_keys == set(), "a key spelled out in the proxy: build it with sessionmem_core.keys"
