"""The control of ``test_agents_sdk_sessionmem.py``: the same upstream bodies (openai-agents 0.24.0's
session tests, unchanged) with the session class rebound to the SDK's own ``RedisSession`` on the same
real valkey-server. What passes here is what ``SessionmemSession`` must pass."""

from __future__ import annotations

import os

import pytest

from tests.client.frameworks import bindings, upstream

if not os.environ.get("SESSIONMEM_FRAMEWORK_CONTROLS"):
    # The control's pytest process does not exit after its summary (RedisSession leaves something of the
    # suites' many event loops behind): not in the default run until that is understood.
    pytest.skip("the RedisSession control runs with SESSIONMEM_FRAMEWORK_CONTROLS=1", allow_module_level=True)
from tests.client.frameworks.conftest import MemoryStack

_SESSION = bindings.sqlite_like(bindings.redis_control)
_LIST = bindings.list_like(bindings.redis_control)
_AGENTS = upstream.OPENAI_AGENTS

globals().update(upstream.public(upstream.load(_AGENTS, "tests/conftest.py", "tests._agents_conftest_ctl", {})))
globals().update(
    upstream.public(
        upstream.load(_AGENTS, "tests/memory/test_session.py", "tests._agents_session_ctl", {"SQLiteSession": _SESSION})
    )
)
globals().update(
    upstream.public(
        upstream.load(
            _AGENTS,
            "tests/memory/test_session_limit.py",
            "tests._agents_session_limit_ctl",
            {"SQLiteSession": _SESSION},
        )
    )
)
globals().update(
    upstream.public(
        upstream.load(
            _AGENTS, "tests/test_hitl_session_scenario.py", "tests._agents_hitl_ctl", {"SimpleListSession": _LIST}
        )
    )
)
globals().update(
    upstream.public(
        upstream.load(
            _AGENTS,
            "tests/extensions/memory/test_encrypt_session.py",
            "tests._agents_encrypt_ctl",
            {"SQLiteSession": _SESSION},
        )
    )
)


@pytest.fixture(autouse=True)
def _bind_stack(memory_stack: MemoryStack) -> None:
    bindings.Stack.current = memory_stack


# Writes from five threads, each with its own event loop, on one session: RedisSession's client binds its
# connections to the loop that opened them and this test never ends on it (counted as a control failure).
CONTROL_HANGS = ("test_sqlite_session_concurrent_access",)
for _name in CONTROL_HANGS:
    del globals()[_name]
