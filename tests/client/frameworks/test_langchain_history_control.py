"""The control of ``test_langchain_history_sessionmem.py``: langchain-core 1.8.1's
tests/unit_tests/runnables/test_history.py as its sdist ships it, on ``InMemoryChatMessageHistory``."""

from __future__ import annotations

from tests.client.frameworks import upstream

globals().update(
    upstream.public(
        upstream.load(
            upstream.LANGCHAIN_CORE, "tests/unit_tests/runnables/test_history.py", "tests._langchain_history_ctl", {}
        )
    )
)
