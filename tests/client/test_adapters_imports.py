"""The base client needs neither framework: adapters import theirs only when they are imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

FRAMEWORKS = ("langchain_core", "agents", "openai", "google.adk")


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_the_base_client_imports_no_framework() -> None:
    result = run(
        "import sys, sessionmem_client, sessionmem_client.retriever\n"
        f"loaded = [m for m in {FRAMEWORKS!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "print('ok')"
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_the_base_client_works_with_the_frameworks_absent() -> None:
    # A None entry in sys.modules makes any import of that name fail, as if it were not installed.
    block = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in FRAMEWORKS)
    result = run(
        block + "from sessionmem_client import MemoryClient, new_conversation_id\nprint(new_conversation_id())"
    )
    assert result.returncode == 0 and len(result.stdout.strip()) == 22, result.stderr


@pytest.mark.parametrize(
    ("module", "hint"),
    [
        ("sessionmem_client.langchain", "pip install langchain-core"),
        ("sessionmem_client.openai_agents", "openai-agents"),
        ("sessionmem_client.google_adk", "pip install google-adk"),
    ],
)
def test_an_adapter_without_its_framework_says_what_to_install(module: str, hint: str) -> None:
    block = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in FRAMEWORKS)
    result = run(block + f"import {module}")
    assert result.returncode != 0 and "ImportError" in result.stderr and hint in result.stderr, result.stderr


def test_the_client_loads_httpx_only_for_a_caller_who_brings_httpx_pieces() -> None:
    # httpx costs each call more CPU than the launcher and the proxy together: the default path skips it.
    result = run(
        "import sys\n"
        "from sessionmem_client import AsyncMemoryClient, MemoryClient\n"
        "MemoryClient('http://127.0.0.1:1'); AsyncMemoryClient('http://127.0.0.1:1')\n"
        "before = 'httpx' in sys.modules\n"
        "import httpx\n"
        "MemoryClient('http://127.0.0.1:1', transport=httpx.MockTransport(lambda r: httpx.Response(200)))\n"
        "print(before)"
    )
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr
