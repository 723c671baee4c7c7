"""Declared dependencies match what each component imports, both ways.

Every import statement of the shipped packages (module level, inside functions and under TYPE_CHECKING
alike) is resolved to the distribution that installs the module, from the development environment's
installed files. The server distribution (pyproject.toml) declares exactly what the shipped components
(core, infra, proxy, launcher, operator) import, each once, and requirements.txt (what the image
installs) pins exactly those; the demo's own needs are its extra; the client distribution
(packaging/client) declares what the client, the contract and the HTTP client import. Product code
imports no private module of a library (``granian._granian``, ``valkey._...``).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The components of the image, by package, with their folders.
SHIPPED = {
    "sessionmem_core": "core",
    "sessionmem_infra": "infra",
    "sessionmem_proxy": "proxy",
    "sessionmem_launcher": "launcher",
    "sessionmem_operator": "operator",
}
# Modules of the client distribution besides the client itself (packaging/client's force-include).
CLIENT_EXTRA_SOURCES = ("core/sessionmem_core", "infra/sessionmem_infra/http_client.py")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: Iterable[str]) -> list[str]:
    names = []
    for requirement in requirements:
        match = _NAME.match(requirement)
        assert match, requirement
        names.append(normalized(match.group(1)))
    return names


def imported_modules(path: Path) -> set[str]:
    """Dotted names of what a file imports: ``import a.b`` gives a.b; ``from a import b`` gives a and a.b
    (b may be a module: a namespace package's parts belong to different distributions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@functools.cache
def _owners() -> dict[Path, str]:
    """Installed file -> the distribution that installed it."""
    owners: dict[Path, str] = {}
    for dist in importlib.metadata.distributions():
        for file in dist.files or ():
            if file.suffix in (".py", ".so", ".pyi") or file.name.endswith(".pth"):
                owners[Path(str(dist.locate_file(file))).resolve()] = normalized(dist.metadata["Name"])
    return owners


def distribution_of(module: str) -> str | None:
    """The distribution installing ``module``; None for the standard library, sessionmem's own packages and
    a name that is no module (an attribute of a ``from`` import)."""
    root = module.split(".")[0]
    if root in sys.stdlib_module_names or root.startswith("sessionmem_") or root in ("tests", "bench"):
        return None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None  # ``from a import b`` where b is an attribute of a, not a module
    if spec is None or spec.origin in (None, "namespace", "built-in", "frozen"):
        return None  # a namespace package: its modules name their own distributions
    owner = _owners().get(Path(spec.origin).resolve())
    assert owner is not None, f"{module} ({spec.origin}) is installed by no distribution"
    return owner


def distributions_imported_by(sources: Iterable[Path]) -> dict[str, set[str]]:
    """Distribution -> the files importing it."""
    found: dict[str, set[str]] = {}
    for path in sources:
        for module in imported_modules(path):
            dist = distribution_of(module)
            if dist is not None:
                found.setdefault(dist, set()).add(str(path.relative_to(REPO)))
    return found


def _files(*places: str) -> list[Path]:
    paths: list[Path] = []
    for place in places:
        target = REPO / place
        paths += [target] if target.is_file() else sorted(target.rglob("*.py"))
    return paths


def _pyproject(path: Path) -> dict[str, list[str]]:
    """'' -> the dependencies; each extra -> its own."""
    project = tomllib.loads(path.read_text())["project"]
    return {"": project["dependencies"], **project.get("optional-dependencies", {})}


SERVER = _pyproject(REPO / "pyproject.toml")
CLIENT = _pyproject(REPO / "packaging" / "client" / "pyproject.toml")


@pytest.mark.parametrize("package", sorted(SHIPPED))
def test_each_shipped_component_declares_what_it_imports(package: str) -> None:
    declared = set(requirement_names(SERVER[""]))
    imported = distributions_imported_by(_files(f"{SHIPPED[package]}/{package}"))
    assert {dist: sorted(files) for dist, files in imported.items() if dist not in declared} == {}


def test_the_server_declares_nothing_its_components_do_not_import_and_each_once() -> None:
    names = requirement_names(SERVER[""])
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    imported = distributions_imported_by(_files(*(f"{folder}/{package}" for package, folder in SHIPPED.items())))
    assert sorted(set(names) - set(imported)) == []


def test_the_image_installs_exactly_the_declared_dependencies() -> None:
    """requirements.txt (the image's install, pinned) names what pyproject.toml declares, each once; the
    Dockerfile installs it and the wheel without its dependencies, so no extra reaches the image."""
    lines = [line.split("#", 1)[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    pinned = requirement_names(line for line in lines if line)
    assert len(pinned) == len(set(pinned)), sorted(n for n in pinned if pinned.count(n) > 1)
    assert sorted(pinned) == sorted(requirement_names(SERVER[""]))
    installs = [line for line in (REPO / "Dockerfile").read_text().splitlines() if "pip install" in line]
    assert installs and all("-r requirements.txt" in line or "--no-deps" in line for line in installs), installs
    assert not [line for line in installs if "[" in line], installs


def test_the_demo_declares_its_own_needs_as_an_extra() -> None:
    """The demo agent's server (uvicorn, run as ``-m uvicorn``) and the local stack's embedded Valkey are
    the ``demo`` extra: the image, which does not install it, carries neither."""
    extra = set(requirement_names(SERVER["demo"]))
    declared = set(requirement_names(SERVER[""])) | extra
    sources = _files("demo/sessionmem_demo")
    imported = distributions_imported_by(sources)
    assert {dist: sorted(files) for dist, files in imported.items() if dist not in declared} == {}
    text = "\n".join(path.read_text() for path in sources)
    run = {normalized(name) for name in re.findall(r'"-m",\s*"([A-Za-z0-9_]+)"', text)}
    assert sorted(extra - set(imported) - run) == []
    assert not extra & set(requirement_names(SERVER[""]))


def test_the_client_distribution_declares_what_it_imports() -> None:
    base = set(requirement_names(CLIENT[""]))
    everything = base.union(*(requirement_names(reqs) for name, reqs in CLIENT.items() if name))
    # The contract and the HTTP client run for every client user: their imports are base dependencies.
    core = distributions_imported_by(_files(*CLIENT_EXTRA_SOURCES))
    assert {dist: sorted(files) for dist, files in core.items() if dist not in base} == {}
    client = distributions_imported_by(_files("client/sessionmem_client"))
    assert {dist: sorted(files) for dist, files in client.items() if dist not in everything} == {}
    assert sorted(base - set(core) - set(client)) == []


def _product_sources() -> list[Path]:
    return _files(*(f"{folder}/{package}" for package, folder in SHIPPED.items()), "client", "demo")


def private_imports(path: Path) -> list[str]:
    """What a file imports of a library's private parts (an underscored module or name)."""
    return sorted(
        module
        for module in imported_modules(path)
        if not module.startswith("sessionmem_")
        and any(part.startswith("_") and not part.startswith("__") for part in module.split("."))
    )


def test_product_code_imports_no_private_module_of_a_library() -> None:
    """A library's underscored modules are its own business: they change without notice."""
    wrong = {str(path.relative_to(REPO)): found for path in _product_sources() if (found := private_imports(path))}
    assert wrong == {}


def test_the_checks_see_what_they_check(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import orjson\n"
        "def f():\n    from granian._granian import ListenerSpec\n    from opentelemetry.sdk import trace\n"
    )
    modules = imported_modules(source)
    assert {"orjson", "granian._granian", "opentelemetry.sdk.trace"} <= modules
    assert {distribution_of(m) for m in modules} - {None} == {"orjson", "granian", "opentelemetry-sdk"}
    assert private_imports(source) == ["granian._granian", "granian._granian.ListenerSpec"]
