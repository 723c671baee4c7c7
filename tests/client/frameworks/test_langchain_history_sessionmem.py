"""langchain-core's own ``RunnableWithMessageHistory`` tests (langchain-core 1.8.1's
tests/unit_tests/runnables/test_history.py, from its sdist, bodies unchanged) with the history class the
bodies construct (``InMemoryChatMessageHistory``) rebound to ``SessionmemChatMessageHistory`` over the
real stack. ``test_langchain_history_control.py`` runs the same bodies on ``InMemoryChatMessageHistory``."""

from __future__ import annotations

import pytest

from tests.client.frameworks import bindings, upstream
from tests.client.frameworks.conftest import MemoryStack

globals().update(
    upstream.public(
        upstream.load(
            upstream.LANGCHAIN_CORE,
            "tests/unit_tests/runnables/test_history.py",
            "tests._langchain_history_sm",
            {"InMemoryChatMessageHistory": bindings.sessionmem_history},
        )
    )
)


@pytest.fixture(autouse=True)
def _bind_stack(memory_stack: MemoryStack) -> None:
    bindings.Stack.current = memory_stack
