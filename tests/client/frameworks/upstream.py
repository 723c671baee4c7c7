"""The frameworks' own test files, taken from their pinned source distributions at test time.

Each sdist is fetched once with pip (``--require-hashes``: the bytes are the ones pinned here) into a cache
per user and extracted; its test modules are then executed as they are, each as a fresh module, and the
caller rebinds the one name that is the test's fixture (the session class the bodies construct) before
pytest collects them. The bodies are never edited, so what passes is the framework's own test.

A framework whose releases ship no tests (Google ADK and langchain-redis: neither their wheels nor their
sdists have them) has its test files kept under ``vendored/`` as upstream wrote them, with upstream's
license, and checked against the hash pinned here before each is copied into the cache and run
(``VendoredFile``): a package index is all a CI machine reaches, and only a release's own files could be
fetched from one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tests

# The project's per-user cache, found as tools/lib/common.sh finds it (``cache_root``), so an emptied
# cache (SESSIONMEM_CACHE_DIR or XDG_CACHE_HOME pointed elsewhere) is empty for the sdists too.
CACHE_ROOT = Path(
    os.environ.get("SESSIONMEM_CACHE_DIR")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sessionmem"
)
CACHE = CACHE_ROOT / "frameworks"


@dataclass(frozen=True)
class Sdist:
    """A pinned source distribution on PyPI."""

    name: str
    version: str
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}.tar.gz"

    @property
    def root(self) -> Path:
        return CACHE / f"{self.name.replace('-', '_')}-{self.version}"


OPENAI_AGENTS = Sdist("openai-agents", "0.24.0", "4b4b285f4fed81fdf1b4ac426a9101658d9cd29b4fb1aaeee18f639b77e704e3")
LANGCHAIN_CORE = Sdist("langchain-core", "1.8.1", "778b9bf1d18d4b7a716311defa230db190006ef75fe175930e00012d82df603b")


@dataclass(frozen=True)
class VendoredFile:
    """A framework's test file kept in this repository (``vendored/<relative>``), byte for byte as
    ``source`` names it, with its hash."""

    source: str  # repository, commit and path it was taken from
    relative: str
    sha256: str

    def installed(self) -> Path:
        """The file, checked against its hash, as a module file in the cache."""
        data = (Path(__file__).parent / "vendored" / self.relative).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        assert digest == self.sha256, f"vendored/{self.relative} is not the pinned file ({digest})"
        target = CACHE / "vendored" / self.sha256[:16] / Path(self.relative).name.removesuffix(".txt")
        if not target.exists() or target.read_bytes() != data:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return target


# google/adk-python's tests/unittests/sessions/test_session_service.py at commit 0c1061401608 (Apache-2.0):
# a 2026 version of its session-service tests, parametrized over ADK's own services. No tag of the 2.13.0
# release was reachable (vendored/adk-python/README.md); 2.13.0's InMemorySessionService passes every
# contract test of this file.
ADK_SESSION_SERVICE_TESTS = VendoredFile(
    "google/adk-python@0c1061401608dbbad00a29d89cc3bade2414281e:tests/unittests/sessions/test_session_service.py",
    "adk-python/test_session_service.py.txt",
    "9e360d0687ed192fe83bececd6b6fc0368d500e8a6cf781ef55e6856a4949743",
)


# langchain-ai/langchain-redis's tests of RedisChatMessageHistory at commit 8d89e5687691 (MIT,
# vendored/langchain-redis/LICENSE): the newest commit reachable; the 0.2.6 release has no tag there. Its
# files differ from the v0.2.5 tag's only in formatting; langchain-redis 0.2.6 passes them (the control).
_LANGCHAIN_REDIS = "langchain-ai/langchain-redis@8d89e568769165b9269c984a24cdba2c8e997fa2:libs/redis/tests"
LANGCHAIN_REDIS_HISTORY_TESTS = VendoredFile(
    f"{_LANGCHAIN_REDIS}/integration_tests/test_chat_message_history.py",
    "langchain-redis/integration_tests/test_chat_message_history.py.txt",
    "aecae98c6e970a9bc55b6c65be879dee76997b00bcbe4c0ff699f0b3e94bb7aa",
)
LANGCHAIN_REDIS_HISTORY_UNIT_TESTS = VendoredFile(
    f"{_LANGCHAIN_REDIS}/unit_tests/test_chat_message_history.py",
    "langchain-redis/unit_tests/test_chat_message_history.py.txt",
    "21c14a7728bffb93d6f8c58247b8e8779563e08700259f31ea956ebc613dd12b",
)
LANGCHAIN_REDIS_TOOL_MESSAGE_TESTS = VendoredFile(
    f"{_LANGCHAIN_REDIS}/unit_tests/test_tool_message_issue_51.py",
    "langchain-redis/unit_tests/test_tool_message_issue_51.py.txt",
    "cc4660924ac32bf92a6c14e31af3906735791c8643882479bdd08dcfabb718de",
)


def fetch(sdist: Sdist) -> Path:
    """The extracted sdist (fetched and checked against its hash the first time)."""
    if (sdist.root / "PKG-INFO").exists():
        return sdist.root
    CACHE.mkdir(parents=True, exist_ok=True)
    archive = CACHE / sdist.filename
    if not archive.exists():
        pins = CACHE / f"{sdist.name}.requirements.txt"
        pins.write_text(f"{sdist.name}=={sdist.version} --hash=sha256:{sdist.sha256}\n")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--require-hashes",
                "-r",
                str(pins),
                "-d",
                str(CACHE),
            ],
            check=True,
        )
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE, filter="data")
    return sdist.root


def upstream_tests(sdist: Sdist) -> Path:
    """The sdist's ``tests`` folder, made importable as part of the ``tests`` package: the frameworks'
    test modules import their helpers as ``tests.<...>`` (this repository's own subpackages come first)."""
    folder = fetch(sdist) / "tests"
    if str(folder) not in tests.__path__:
        tests.__path__.append(str(folder))
    return folder


def load(sdist: Sdist, relative: str, as_name: str, rebind: Mapping[str, Any]) -> types.ModuleType:
    """Execute the sdist's test file ``relative`` as a fresh module ``as_name`` and rebind ``rebind``'s
    names in it (what the bodies look up at run time)."""
    upstream_tests(sdist)
    return load_file(fetch(sdist) / relative, as_name, rebind)


def load_file(path: Path, as_name: str, rebind: Mapping[str, Any]) -> types.ModuleType:
    """:func:`load` of a test file at ``path`` (a vendored one, as :meth:`VendoredFile.installed` gives it)."""
    spec = importlib.util.spec_from_file_location(as_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[as_name] = module
    spec.loader.exec_module(module)
    for name, value in rebind.items():
        assert hasattr(module, name), f"{path.name} no longer defines {name}: re-check the port"
        setattr(module, name, value)
    return module


def public(module: types.ModuleType) -> dict[str, Any]:
    """The names a wrapper module takes over so pytest collects the upstream tests and fixtures there."""
    return {name: value for name, value in vars(module).items() if not name.startswith("__")}
