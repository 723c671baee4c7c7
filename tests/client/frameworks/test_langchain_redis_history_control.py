"""The control of ``test_langchain_redis_history_sessionmem.py``: langchain-redis's own tests of
``RedisChatMessageHistory`` (its chat-history integration and unit tests and its tool-message tests,
``upstream.LANGCHAIN_REDIS_*``, bodies unchanged) on langchain-redis 0.2.6's ``RedisChatMessageHistory``
itself, over a real valkey-server that loads RediSearch and RedisJSON (upstream runs them on a
redis-stack container). Only the ``redis_url`` fixture is upstream's conftest's, rebound to that server.
What passes here is what ``SessionmemChatMessageHistory`` must pass."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.client.frameworks import bindings, upstream
from tests.support.valkey import ValkeyProcess, search_module_args

# langchain-redis 0.2.6 marks RedisChatMessageHistory deprecated (in favour of LangGraph's short-term
# memory); it is still what its users have.
pytestmark = pytest.mark.filterwarnings("ignore:The class `RedisChatMessageHistory` was deprecated")

for _tests, _name in (
    (upstream.LANGCHAIN_REDIS_HISTORY_TESTS, "tests._langchain_redis_history_ctl"),
    (upstream.LANGCHAIN_REDIS_HISTORY_UNIT_TESTS, "tests._langchain_redis_history_unit_ctl"),
    (upstream.LANGCHAIN_REDIS_TOOL_MESSAGE_TESTS, "tests._langchain_redis_tool_message_ctl"),
):
    globals().update(upstream.public(upstream.load_file(_tests.installed(), _name, {})))


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A valkey-server with the search and JSON modules, for this module: a ``redis://`` URL, as
    upstream's conftest gives it, asking for RESP2 (``bindings.REDIS_URL_PROTOCOL``)."""
    server = ValkeyProcess(extra_args=search_module_args())
    server.start()
    yield f"redis://{server.addr}/0{bindings.REDIS_URL_PROTOCOL}"
    server.close()
