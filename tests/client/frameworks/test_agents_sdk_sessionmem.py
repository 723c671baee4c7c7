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


# The upstream tests that fail on the control (RedisSession) as well: they test SQLiteSession's own
# connections, worker threads, locks, corrupt rows and tables, or subclass the class the port rebinds.
# Marked (not strict: a parametrized case may pass), so the run shows them and stays green.
FAIL_ON_CONTROL_TOO = (
    "test_clear_revokes_encrypted_deferred_compaction",
    "test_encrypted_compaction_restores_original_tokens_before_concurrent_append",
    "test_encrypted_compaction_skips_unencrypted_stored_history",
    "test_encrypted_pop_authentication_is_atomic_with_concurrent_mutations",
    "test_encrypted_pop_cancellation_waits_for_authentication_rollback",
    "test_encrypted_pop_delegates_to_overridden_sqlite_pop",
    "test_encrypted_pop_rechecks_authentication_after_expired_tail",
    "test_encrypted_pop_skips_plaintext_with_inherited_sqlite_behavior",
    "test_encrypted_pop_wrong_key_preserves_recoverable_history",
    "test_encrypted_pop_wrong_key_preserves_row_identity",
    "test_encrypted_session_preserves_optional_compaction_delegation",
    "test_encrypted_session_scan_budget_rejects_negative_limit_before_read",
    "test_runner_recovers_encrypted_resumed_append",
    "test_sqlite_session_close_closes_worker_thread_connections",
    "test_sqlite_session_close_retries_quarantined_connection",
    "test_sqlite_session_closed_rejects_empty_add_items",
    "test_sqlite_session_closes_retired_connections_before_the_next_allocation",
    "test_sqlite_session_failed_add_items_releases_write_lock",
    "test_sqlite_session_failed_clear_session_rolls_back",
    "test_sqlite_session_failed_pop_item_releases_write_lock",
    "test_sqlite_session_file_lock_is_shared_across_instances",
    "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows",
    "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows",
    "test_sqlite_session_keeps_connections_of_live_worker_threads",
    "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows",
    "test_sqlite_session_pop_item_skips_corrupt_most_recent",
    "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome",
    "test_sqlite_session_reaps_connections_from_exited_worker_threads",
    "test_sqlite_session_rollback_failure_evicts_connection",
)
for _name in FAIL_ON_CONTROL_TOO:
    globals()[_name] = pytest.mark.xfail(reason="fails on the RedisSession control too", strict=False)(globals()[_name])


@pytest.fixture(autouse=True)
def _bind_stack(memory_stack: MemoryStack) -> None:
    bindings.Stack.current = memory_stack
