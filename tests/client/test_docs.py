"""Every Python example in docs/client.md runs, as written, against a real launcher, proxy and valkey-server."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import warnings
from pathlib import Path

# Imported up front: on first import LangChain puts its own filter for its deprecation warnings first in
# line, which would override the one the LangChain example runs under.
import langchain_core.runnables.history  # noqa: F401
import pytest

from sessionmem_core import env
from sessionmem_launcher.server import Launcher

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
NOT_RUN = "# (not run"
_FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^## (.+)$", re.MULTILINE)


def examples() -> list[tuple[str, str]]:
    """(section heading, code) for every ```python block, in document order."""
    text = DOC.read_text()
    headings = [(m.start(), m.group(1).strip()) for m in _HEADING.finditer(text)]
    found = []
    for block in _FENCE.finditer(text):
        section = next((title for start, title in reversed(headings) if start < block.start()), "intro")
        found.append((section, block.group(1)))
    return found


EXAMPLES = examples()


def test_the_document_has_examples_and_every_one_compiles() -> None:
    assert len(EXAMPLES) >= 10
    for section, code in EXAMPLES:
        compile(code, f"{DOC.name} ({section})", "exec")


@pytest.mark.parametrize(
    "code",
    # Examples marked NOT_RUN need a perUser agent: tests/client/test_lifecycle.py runs that flow instead.
    [
        pytest.param(code, id=f"{n}-{section}")
        for n, (section, code) in enumerate(EXAMPLES)
        if not code.startswith(NOT_RUN)
    ],
)
async def test_the_example_runs(launcher: Launcher, monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    # The examples use the default base URL: point it at this test's launcher the way a pod does.
    monkeypatch.setenv(env.LAUNCHER_PORT, str(launcher.memory_port))
    compiled = compile(code, DOC.name, "exec")
    output = io.StringIO()

    def run() -> None:
        with contextlib.redirect_stdout(output), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="RunnableWithMessageHistory is deprecated")
            exec(compiled, {"__name__": "__main__"})  # noqa: S102 - our own documentation

    # In a worker thread: the launcher serves from this event loop, and async examples call asyncio.run.
    await asyncio.to_thread(run)
    assert output.getvalue(), "every example prints what it shows"
