"""The control of ``test_agents_sqlalchemy_session_sessionmem.py``: openai-agents 0.24.0's
``tests/extensions/memory/test_sqlalchemy_session.py`` (from its sdist, bodies unchanged) as upstream
runs it, on the SDK's own ``SQLAlchemySession`` over SQLite (aiosqlite, in memory or in the test's
temporary folder). What passes here is what ``SessionmemSession`` must pass."""

from __future__ import annotations

from tests.client.frameworks import upstream

globals().update(
    upstream.public(
        upstream.load(
            upstream.OPENAI_AGENTS,
            "tests/extensions/memory/test_sqlalchemy_session.py",
            "tests._agents_sqlalchemy_ctl",
            {},
        )
    )
)
