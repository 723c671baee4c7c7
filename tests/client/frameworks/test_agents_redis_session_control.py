"""The control of ``test_agents_redis_session_sessionmem.py``: openai-agents 0.24.0's
``tests/extensions/memory/test_redis_session.py`` (from its sdist, bodies unchanged) on the SDK's own
``RedisSession`` against the stack's real valkey-server. The file runs its fakeredis-only tests on
fakeredis and the rest on a real Redis at ``REDIS_URL``: fakeredis is not used here, so ``REDIS_URL`` is
rebound to the valkey-server (database 15, as upstream's) and the fakeredis-only tests skip as upstream
skips them without it. What passes here is what ``SessionmemSession`` must pass.

Unlike ``test_agents_sdk_control.py`` it runs by default: this file makes no event loop of its own
(no ``Runner.run_sync``), and its pytest process exits after the summary."""

from __future__ import annotations

import pytest

from tests.client.frameworks import bindings, upstream
from tests.client.frameworks.conftest import MemoryStack

_MODULE = upstream.load(
    upstream.OPENAI_AGENTS, "tests/extensions/memory/test_redis_session.py", "tests._agents_redis_ctl", {}
)
globals().update(upstream.public(_MODULE))


@pytest.fixture(autouse=True)
def _bind_stack(memory_stack: MemoryStack, monkeypatch: pytest.MonkeyPatch) -> None:
    bindings.Stack.current = memory_stack
    monkeypatch.setattr(_MODULE, "REDIS_URL", bindings.redis_url(memory_stack, database=15))
