"""What the frameworks' test bodies construct, rebound: each factory takes the arguments of the class the
bodies name (``SQLiteSession(session_id, db_path, session_settings=...)``, ``SimpleListSession(...)``,
``InMemoryChatMessageHistory()``) and answers a session of the backend under test, sessionmem's adapter
or the control (the SDK's ``RedisSession`` on the same real valkey-server)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import types
import uuid
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from agents.extensions.memory.redis_session import RedisSession
from agents.memory import SessionSettings
from langchain_core.messages import BaseMessage

from sessionmem_client import AsyncMemoryClient, MemoryClient
from sessionmem_client.langchain import SessionmemChatMessageHistory
from sessionmem_client.openai_agents import SessionmemSession
from tests.client.frameworks import upstream
from tests.client.frameworks.conftest import MemoryStack, Namespaces


class Stack:
    """The module's stack, set by its autouse fixture before each test."""

    current: MemoryStack | None = None

    @classmethod
    def get(cls) -> MemoryStack:
        assert cls.current is not None, "the memory_stack fixture sets the stack first"
        return cls.current


_instances = iter(range(1 << 62))

Backend = Callable[[str, SessionSettings | dict[str, Any] | None], Any]


def sessionmem(name: str, settings: SessionSettings | dict[str, Any] | None) -> SessionmemSession:
    return SessionmemSession(name, AsyncMemoryClient(Stack.get().memory_url), session_settings=settings)


def redis_url(stack: MemoryStack, database: int = 0) -> str:
    """The stack's valkey-server as a ``redis://`` URL (redis-py's scheme) of ``database``."""
    address = urlsplit(stack.valkey_url).netloc
    return f"redis://{address}/{database}"


def redis_control(name: str, settings: SessionSettings | dict[str, Any] | None) -> RedisSession:
    return RedisSession.from_url(name, url=redis_url(Stack.get()), key_prefix="control", session_settings=settings)


def sqlite_like(backend: Backend) -> Callable[..., Any]:
    """``SQLiteSession(session_id, db_path=":memory:", session_settings=None)``: one database file is one
    namespace of the backend (two sessions on the same file and id share their items); ``:memory:`` is
    a database of its own per instance, as in SQLite."""

    def make(session_id: str, db_path: Any = ":memory:", session_settings: Any = None, **_: Any) -> Any:
        database = str(db_path)
        if database == ":memory:":
            database = f"memory{next(_instances)}"
        scope = hashlib.sha256(database.encode()).hexdigest()[:8]
        return backend(f"{Namespaces.current}-{scope}-{session_id}", session_settings)

    return make


def list_like(backend: Backend) -> Callable[..., Any]:
    """``SimpleListSession(session_id=..., history=None)``. A stored session is rehydrated by its id: one
    made again with an id this test used holds that session's items already (the ``history`` the test
    passes is what it had read from it). A fresh id with a history would need seeding, which the
    scenarios ported here do not do: refused, so a test that does fails visibly."""
    made: dict[str, set[str]] = {}

    def make(session_id: str = "test", history: Any = None, **_: Any) -> Any:
        seen = made.setdefault(Namespaces.current, set())
        session_id = session_id.removeprefix(f"{Namespaces.current}-")  # a made session's own id
        if history and session_id not in seen:
            raise NotImplementedError("seeding a fresh stored session from a list")
        seen.add(session_id)
        return backend(f"{Namespaces.current}-{session_id}", None)

    return make


def _scoped(scope: str, session_id: str) -> str:
    """The conversation id of ``session_id`` in one store of the backend the bodies name (a database, a
    URL and key prefix), inside this test's namespace."""
    return f"{Namespaces.current}-{hashlib.sha256(scope.encode()).hexdigest()[:8]}-{session_id}"


REDIS_PREFIX = "agents:session"  # RedisSession's default key_prefix


def redis_like(backend: Backend) -> type[Any]:
    """``RedisSession``, rebound: ``RedisSession.from_url(session_id, url=..., key_prefix=..., ttl=...,
    session_settings=...)`` answers a session of ``backend``, one store per URL and key prefix (the same
    id under another prefix is another session, as in Redis). ``ttl``: sessionmem's retention is the
    agent's (``spec.sessionMemory``), not the session's; a body that reads a key's expiry reads Redis.
    Made from a Redis client object (``RedisSession(session_id, redis_client=...)``, or a subclass of
    it), it has no meaning here: refused with ``TypeError``, so such a test fails visibly."""

    class RedisSessionRebound:
        def __new__(cls, session_id: str, redis_client: Any = None, **_: Any) -> Any:
            raise TypeError("a sessionmem session is made from no Redis client")

        @classmethod
        def from_url(
            cls,
            session_id: str,
            *,
            url: str,
            key_prefix: str = REDIS_PREFIX,
            session_settings: Any = None,
            **_: Any,
        ) -> Any:
            return backend(_scoped(f"{url} {key_prefix}", session_id), session_settings)

    return RedisSessionRebound


def redis_helpers(backend: Backend) -> dict[str, Any]:
    """test_redis_session.py's two module helpers, rebound (upstream's own signatures and behaviour:
    ``_create_test_session`` clears the session it makes, ``_create_redis_session`` does not)."""
    rebound = redis_like(backend)
    url = "redis://localhost:6379/15"  # upstream's REDIS_URL: one store, scoped by key prefix

    async def create_redis_session(session_id: str, key_prefix: str = "test:", ttl: int | None = None) -> Any:
        return rebound.from_url(session_id, url=url, key_prefix=key_prefix, ttl=ttl)

    async def create_test_session(session_id: str | None = None) -> Any:
        if session_id is None:
            session_id = f"test_session_{uuid.uuid4().hex[:8]}"
        session = rebound.from_url(session_id, url=url, key_prefix="test:")
        await session.clear_session()
        return session

    return {
        "RedisSession": rebound,
        "_create_redis_session": create_redis_session,
        "_create_test_session": create_test_session,
    }


def sqlalchemy_like(backend: Backend) -> type[Any]:
    """``SQLAlchemySession``, rebound: ``SQLAlchemySession.from_url(session_id, url=..., ...)`` and
    ``SQLAlchemySession(session_id, engine=..., ...)`` answer a session of ``backend``, one store per
    database: per URL, per engine, and per instance for SQLite's ``:memory:`` (each engine of it is a
    database of its own). Table names and ``create_tables`` name SQL schema: no meaning here."""
    engines: dict[int, tuple[Any, str]] = {}  # kept alive: an id is not reused while its engine lives

    def store(url: str) -> str:
        return f"memory{next(_instances)}" if ":memory:" in url else url

    class SQLAlchemySessionRebound:
        def __new__(cls, session_id: str, engine: Any, session_settings: Any = None, **_: Any) -> Any:
            if id(engine) not in engines:
                engines[id(engine)] = (engine, store(str(engine.url)))
            return backend(_scoped(engines[id(engine)][1], session_id), session_settings)

        @classmethod
        def from_url(cls, session_id: str, *, url: str, session_settings: Any = None, **_: Any) -> Any:
            return backend(_scoped(store(url), session_id), session_settings)

    return SQLAlchemySessionRebound


def sessionmem_history(messages: Sequence[BaseMessage] = ()) -> SessionmemChatMessageHistory:
    """``InMemoryChatMessageHistory(messages=...)``: a fresh conversation per instance, holding ``messages``."""
    url = Stack.get().memory_url
    history = SessionmemChatMessageHistory(
        f"{Namespaces.current}-h{next(_instances)}", MemoryClient(url), async_client=AsyncMemoryClient(url)
    )
    if messages:
        history.add_messages(messages)
    return history


# The Redis protocol langchain-redis's tests are run with: RESP2, the default of the redis-py they pin
# (6.4). redis-py 8 (pinned here for the Agents SDK's RedisSession) defaults to RESP3, whose FT.INFO
# answer RedisChatMessageHistory 0.2.6 cannot parse (its index-prefix check raises AttributeError).
REDIS_URL_PROTOCOL = "?protocol=2"


@functools.cache
def _memory_client(url: str) -> MemoryClient:
    """One client per stack, shared by the histories of its tests (each would otherwise pool its own)."""
    return MemoryClient(url)


def sessionmem_redis_history(
    session_id: str,
    redis_url: str = "redis://localhost:6379",
    key_prefix: str = "chat:",
    ttl: int | None = None,
    index_name: str = "idx:chat_history",
    redis_client: Any = None,
    overwrite_index: bool = False,
    **_: Any,
) -> SessionmemChatMessageHistory:
    """``RedisChatMessageHistory(session_id, redis_url=..., key_prefix=..., ttl=..., index_name=...,
    redis_client=..., overwrite_index=...)``, rebound: the history of conversation ``session_id`` (as
    given, so the adapter's own id rule answers a bad one) on the stack's agent. The rest names Redis
    things with no meaning here: a server, its keys and its search index, and a TTL per history (retention
    is the agent's, ``spec.sessionMemory``). The key prefix does not scope ids: every test of the suite
    uses ids of its own. Made from a Redis client object (``redis_client=...``) it is refused with
    ``TypeError``, so such a test fails visibly."""
    if redis_client is not None:
        raise TypeError("a sessionmem history is made from no Redis client")
    return SessionmemChatMessageHistory(session_id, _memory_client(Stack.get().memory_url))


def contract_tests(module: types.ModuleType, fixture: str = "session_service") -> dict[str, Any]:
    """The module's names for pytest, its tests only those that take ``fixture``: the behaviour every
    implementation of the interface owes (ADK's file also tests its own SQL services' internals, which
    construct those services themselves and say nothing of the one under test)."""
    names = upstream.public(module)
    return {
        name: value
        for name, value in names.items()
        if not (name.startswith("test_") and callable(value)) or fixture in inspect.signature(value).parameters
    }


async def forget_everything(client: AsyncMemoryClient) -> None:
    """Delete every conversation of the stack's agent: each of the suites' tests had a fresh service."""
    async for conversation_id in client.iter_conversations(page_size=500):
        await client.delete(conversation_id)
