"""langchain-redis's own tests of ``RedisChatMessageHistory`` (its chat-history integration and unit
tests and its tool-message tests, ``upstream.LANGCHAIN_REDIS_*``, bodies unchanged) on
``SessionmemChatMessageHistory`` over the real stack: the class the bodies construct
(``RedisChatMessageHistory``) is rebound (``bindings.sessionmem_redis_history``), and the ``redis_url``
fixture is the stack's valkey-server, nothing else. ``test_langchain_redis_history_control.py`` runs the
same bodies on langchain-redis 0.2.6's ``RedisChatMessageHistory``, the control.

The agent keeps up to 10,000 entries per conversation (``spec.sessionMemory``'s stored cap; the seed's
default is 500): a Redis history keeps every message, and one test stores 1,000."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from sessionmem_core import env
from tests.client.frameworks import bindings, upstream
from tests.client.frameworks.conftest import MemoryStack

pytestmark = pytest.mark.filterwarnings("ignore:The class `RedisChatMessageHistory` was deprecated")

for _tests, _name in (
    (upstream.LANGCHAIN_REDIS_HISTORY_TESTS, "tests._langchain_redis_history_sm"),
    (upstream.LANGCHAIN_REDIS_HISTORY_UNIT_TESTS, "tests._langchain_redis_history_unit_sm"),
    (upstream.LANGCHAIN_REDIS_TOOL_MESSAGE_TESTS, "tests._langchain_redis_tool_message_sm"),
):
    globals().update(
        upstream.public(
            upstream.load_file(
                _tests.installed(), _name, {"RedisChatMessageHistory": bindings.sessionmem_redis_history}
            )
        )
    )


@pytest.fixture(scope="module")
def agent_settings() -> dict[str, str]:
    return {env.CAP: str(env.MAX_CAP)}


@pytest.fixture
def redis_url(memory_stack: MemoryStack) -> str:
    """The stack's valkey-server, as the control's fixture gives its server: what the bodies pass the
    history (which has no use for it) and read Redis with directly."""
    return bindings.redis_url(memory_stack) + bindings.REDIS_URL_PROTOCOL


@pytest.fixture(autouse=True)
def _bind_stack(memory_stack: MemoryStack) -> None:
    bindings.Stack.current = memory_stack


# The tests that cannot pass on any history but RedisChatMessageHistory, each with the Redis internal it
# reaches and the error that reaching it raises here (``raises``: any other failure is a real one).
_CLIENT = "reads history.redis_client, the Redis client"
_MADE_FROM_CLIENT = "made from a Redis client object (RedisChatMessageHistory(redis_client=...))"
_MOCKED_INDEX = (
    f"{_MADE_FROM_CLIENT}, a mock, and asserts what RedisChatMessageHistory hands its RedisVL search index "
    "(mocked too); the round trip of a ToolMessage is tests/client/test_adapters_langchain.py's"
)
REDIS_INTERNALS: dict[str, tuple[str, type[BaseException]]] = {
    "test_ttl": (f"{_CLIENT}: the message's key and its TTL (retention is the agent's here)", AttributeError),
    "test_index_creation": ("reads the history's search index (FT.INFO) on the Redis server", ResponseError),
    "test_json_structure": (f"{_CLIENT}: the message's RedisJSON document", AttributeError),
    "test_chat_history_with_preconfigured_client": (_MADE_FROM_CLIENT, TypeError),
    "test_invalid_redis_url": (
        "points the history at an unreachable Redis URL: a sessionmem history's server is the pod's memory "
        "endpoint, and an unreachable one raises BackendUnavailable (tests/client/test_errors.py)",
        pytest.fail.Exception,
    ),
    "test_custom_index_name": ("reads the history's custom search index (FT.INFO) on the Redis server", ResponseError),
    "test_redis_connection_recovery": (f"{_CLIENT}: its connection pool", AttributeError),
    "test_key_prefix_isolation_with_overwrite": ("looks for Redis keys under the history's key prefix", AssertionError),
    "test_key_prefix_conflict_warning": (
        "asserts RedisChatMessageHistory's warning of a search-index prefix conflict, and the lost messages",
        AssertionError,
    ),
    "TestRedisChatMessageHistoryMinimal.test_session_id_validation_empty_string": (
        "matches langchain-redis's error text; the adapter's ValueError (InvalidConversationId) says its own",
        AssertionError,
    ),
    "TestRedisChatMessageHistoryMinimal.test_session_id_validation_none": (
        "matches langchain-redis's error text; the adapter's ValueError (InvalidConversationId) says its own",
        AssertionError,
    ),
    "TestRedisChatMessageHistoryMinimal.test_message_key_generation_with_provided_id": (
        "calls RedisChatMessageHistory._message_key, the Redis key of a message",
        AttributeError,
    ),
    "TestRedisChatMessageHistoryMinimal.test_message_key_generation_with_custom_prefix": (
        "calls RedisChatMessageHistory._message_key, the Redis key of a message",
        AttributeError,
    ),
    "TestRedisChatMessageHistoryMinimal.test_message_key_generation_auto_id": (
        "calls RedisChatMessageHistory._message_key, the Redis key of a message",
        AttributeError,
    ),
    "TestRedisChatMessageHistoryMinimal.test_default_parameters": (
        "reads the Redis settings (key_prefix, ttl, index_name)",
        AttributeError,
    ),
    "TestRedisChatMessageHistoryMinimal.test_custom_parameters": (
        "reads the Redis settings (key_prefix, ttl, index_name)",
        AttributeError,
    ),
    **{
        f"TestToolMessageIssue51.{name}": (_MOCKED_INDEX, TypeError)
        for name in (
            "test_add_tool_message_stores_tool_call_id",
            "test_add_regular_messages_without_tool_call_id",
            "test_retrieve_tool_message_without_key_error",
            "test_round_trip_tool_message",
            "test_mixed_message_types_with_tool_message",
        )
    },
}
for _test, (_reason, _raises) in REDIS_INTERNALS.items():
    _mark = pytest.mark.xfail(reason=_reason, raises=_raises, strict=True)
    _class, _, _name = _test.rpartition(".")  # a test method: "Class.method"
    if _class:
        setattr(globals()[_class], _name, _mark(getattr(globals()[_class], _name)))
    else:
        globals()[_name] = _mark(globals()[_name])
