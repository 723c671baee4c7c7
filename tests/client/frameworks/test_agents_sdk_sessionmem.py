"""The OpenAI Agents SDK's own session tests (openai-agents 0.24.0, from its sdist, bodies unchanged) on
``SessionmemSession`` over the real stack: the session class each body constructs is rebound, nothing
else. ``test_agents_sdk_control.py`` runs the same bodies on the SDK's ``RedisSession`` (real
valkey-server), the control."""

from __future__ import annotations

import pytest

from tests.client.frameworks import bindings, upstream
from tests.client.frameworks.conftest import MemoryStack

_SESSION = bindings.sqlite_like(bindings.sessionmem)
_LIST = bindings.list_like(bindings.sessionmem)
_AGENTS = upstream.OPENAI_AGENTS

globals().update(upstream.public(upstream.load(_AGENTS, "tests/conftest.py", "tests._agents_conftest_sm", {})))
globals().update(
    upstream.public(
        upstream.load(_AGENTS, "tests/memory/test_session.py", "tests._agents_session_sm", {"SQLiteSession": _SESSION})
    )
)
globals().update(
    upstream.public(
        upstream.load(
            _AGENTS, "tests/memory/test_session_limit.py", "tests._agents_session_limit_sm", {"SQLiteSession": _SESSION}
        )
    )
)
globals().update(
    upstream.public(
        upstream.load(
            _AGENTS, "tests/test_hitl_session_scenario.py", "tests._agents_hitl_sm", {"SimpleListSession": _LIST}
        )
    )
)

globals().update(
    upstream.public(
        upstream.load(
            _AGENTS,
            "tests/extensions/memory/test_encrypt_session.py",
            "tests._agents_encrypt_sm",
            {"SQLiteSession": _SESSION},
        )
    )
)


@pytest.fixture(autouse=True)
def _bind_stack(memory_stack: MemoryStack) -> None:
    bindings.Stack.current = memory_stack
