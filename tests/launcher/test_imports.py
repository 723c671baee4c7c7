"""The launcher runs in every agent pod and starts on every cold start: behind the proxy it must not load
the proxy's web stack or a general HTTP client (each is megabytes of resident memory and milliseconds of
start-up). Checked in a fresh interpreter, where nothing else has imported them first."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

HEAVY = ("httpx", "pydantic", "uvicorn", "fastapi", "starlette", "valkey")

_LOADED = f"loaded = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_importing_the_launcher_entry_point_loads_no_heavy_dependency() -> None:
    result = run("import sys\nimport sessionmem_launcher.__main__\n" + _LOADED + "print(loaded)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_launcher_that_started_and_forwarded_a_call_loaded_none_either() -> None:
    # Past the imports too: start both listeners, forward one call (to a proxy that is not there, which
    # takes the error path as well), stop.
    code = textwrap.dedent(
        """
        import asyncio, socket, sys
        import sessionmem_launcher.__main__
        from sessionmem_core.env import LauncherSettings
        from sessionmem_launcher.server import Launcher

        def unused_port():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]

        async def main():
            settings = LauncherSettings.from_env({
                "SESSIONMEM_PROXY_URL": f"http://127.0.0.1:{unused_port()}",
                "SESSIONMEM_TOKEN_PATH": "/nonexistent/token",
                "SESSIONMEM_NAMESPACE": "team-a",
                "SESSIONMEM_AGENT": "support-agent",
                "SESSIONMEM_LAUNCHER_PORT": str(unused_port()),
                "SESSIONMEM_SERVE_PORT": str(unused_port()),
            })
            launcher = Launcher(settings, serve_host="127.0.0.1")
            await launcher.start()
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", launcher.memory_port)
                request = b"GET /v1/conversations/c1/entries HTTP/1.1\\r\\nhost: x\\r\\nconnection: close\\r\\n\\r\\n"
                writer.write(request)
                answer = await reader.read()
                writer.close()
            finally:
                await launcher.stop()
            return answer.split(b"\\r\\n", 1)[0].decode()

        status = asyncio.run(main())
        """
    )
    result = run(code + _LOADED + "print(status, loaded)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "HTTP/1.1 503 Service Unavailable []"


def test_no_launcher_module_imports_the_proxy() -> None:
    # The launcher knows the proxy by its HTTP API only (issue #21): checked in the source, so an import
    # inside a function or under TYPE_CHECKING is caught too ...
    root = Path(__file__).resolve().parents[2] / "launcher"
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                names = [node.module]
            else:
                continue
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] == "sessionmem_proxy"]
    assert found == []
    # ... and at run time: every launcher module imported in a fresh interpreter loads none of it.
    result = run(
        "import pkgutil, importlib, sys, sessionmem_launcher\n"
        "for m in pkgutil.walk_packages(sessionmem_launcher.__path__, 'sessionmem_launcher.'):\n"
        "    if m.name != 'sessionmem_launcher.__main__': importlib.import_module(m.name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('sessionmem_proxy')))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_launcher_process_loads_granian_without_its_optional_modules() -> None:
    # Reloading, .env files and process titles are not features of granian's embedded server; the image
    # installs those modules for other components, and the launcher's RSS budget has no room for them.
    result = run(
        "import os, sys\n"
        "from sessionmem_launcher.__main__ import import_launcher_with_small_granian\n"
        "import_launcher_with_small_granian()\n"
        "from granian import _imports\n"
        "print(sorted(m for m in ('anyio', 'dotenv', 'watchfiles', 'setproctitle') if m in sys.modules),\n"
        "      _imports.watchfiles, bool(os.environ.get('_RJEM_MALLOC_CONF')))\n"
        "import importlib.util\n"
        "print(importlib.util.find_spec('watchfiles') is not None)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "[] None True"
