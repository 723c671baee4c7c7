"""The proxy's pipelining Valkey client (``sessionmem_proxy.resp_client``) against a real valkey-server:
replies matched to their commands under concurrency, a held command failing alone, a silent connection
replaced, a dead server failing typed and a restarted one reconnected, bounded queues, scripts, auth."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import valkey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import ResponseError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

from sessionmem_proxy.resp_client import Endpoint, PipelinedValkey, pack
from tests.support.valkey import ValkeyProcess

# A write the server holds under CLIENT PAUSE WRITE, answering its argument: which reply reached which
# caller is visible in the answer.
SET_AND_ECHO = "redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1]"
ECHO_READ = "#!lua flags=no-writes\nreturn ARGV[1]"


def admin(server: ValkeyProcess) -> Any:
    return valkey.Valkey(host="127.0.0.1", port=server.port)  # untyped execute_command


@pytest.fixture
async def client(valkey_server: ValkeyProcess) -> AsyncIterator[PipelinedValkey]:
    client = PipelinedValkey.from_url(valkey_server.url, 0.5, connections=2)
    yield client
    await client.aclose()


async def test_concurrent_commands_each_get_their_own_reply(
    client: PipelinedValkey, valkey_server: ValkeyProcess
) -> None:
    sync = valkey_server.client()
    for i in range(50):
        admin(valkey_server).rpush(f"k{i}", *[f"{i}-{j}".encode() for j in range(i % 7 + 1)])
    script = client.register_script(ECHO_READ)

    async def one(n: int) -> None:
        i = n % 50
        if n % 3 == 0:
            assert await client.lrange(f"k{i}", 0, -1) == [f"{i}-{j}".encode() for j in range(i % 7 + 1)]
        elif n % 3 == 1:
            assert await script(keys=[f"k{i}"], args=[f"echo-{n}"]) == f"echo-{n}".encode()
        else:
            assert await client.execute(("INCR", f"counter{i}")) >= 1

    await asyncio.gather(*(one(n) for n in range(3000)))
    assert sync.ping()
    assert sum(int(admin(valkey_server).get(f"counter{i}")) for i in range(50)) == 1000


async def test_a_held_write_fails_alone_and_its_late_reply_reaches_nobody(valkey_server: ValkeyProcess) -> None:
    """One connection per kind: the held write and the write after it share a connection. The first times
    out; when the server answers both, the second caller gets its own answer, not the first one's."""
    client = PipelinedValkey.from_url(valkey_server.url, 0.4, connections=1)
    write = client.register_script(SET_AND_ECHO)
    try:
        assert await write(keys=["w"], args=["before"]) == b"before"
        admin(valkey_server).execute_command("CLIENT", "PAUSE", 1500, "WRITE")
        held = asyncio.ensure_future(write(keys=["w"], args=["first"]))
        await asyncio.sleep(0.05)
        # Reads are answered meanwhile: they are on connections of their own.
        started = time.monotonic()
        assert await client.lrange("absent", 0, -1) == []
        assert time.monotonic() - started < 0.3
        with pytest.raises(ValkeyTimeoutError):
            await held
        second = asyncio.ensure_future(write(keys=["w"], args=["second"]))
        admin(valkey_server).execute_command("CLIENT", "UNPAUSE")
        assert await second == b"second"
        assert await write(keys=["w"], args=["third"]) == b"third"
        assert admin(valkey_server).get("w") == b"third"
    finally:
        admin(valkey_server).execute_command("CLIENT", "UNPAUSE")
        await client.aclose()


async def test_a_silent_connection_gets_no_new_commands_and_is_replaced(valkey_server: ValkeyProcess) -> None:
    client = PipelinedValkey.from_url(valkey_server.url, 0.2, connections=1)
    try:
        assert await client.ping()
        admin(valkey_server).execute_command("CLIENT", "PAUSE", 600, "ALL")
        started = time.monotonic()
        with pytest.raises(ValkeyTimeoutError):
            await client.ping()
        assert time.monotonic() - started < 0.5
        # The silent connection was closed once nothing waited on it: a new one answers after the pause.
        deadline = time.monotonic() + 5
        while True:
            try:
                assert await client.ping()
                break
            except (ValkeyTimeoutError, ValkeyConnectionError):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        clients = admin(valkey_server).execute_command("CLIENT", "LIST").decode().splitlines()
        assert len(clients) == 2  # the admin connection and the client's new one; the silent one is gone
    finally:
        await client.aclose()


async def test_a_dead_server_fails_typed_at_once_and_a_restarted_one_is_reconnected() -> None:
    server = ValkeyProcess()
    server.start()
    client = PipelinedValkey.from_url(server.url, 1.0)
    try:
        assert await client.ping()
        admin(server).execute_command("CLIENT", "PAUSE", 2000, "WRITE")
        pending = asyncio.ensure_future(client.execute(("SET", "k", "v")))
        await asyncio.sleep(0.05)
        server.kill()
        started = time.monotonic()
        with pytest.raises(ValkeyConnectionError):
            await pending
        with pytest.raises(ValkeyConnectionError):
            await client.ping()
        assert time.monotonic() - started < 0.9
        server.start()
        assert await client.ping()
        assert await client.execute(("SET", "k", "v2")) == b"OK"
    finally:
        await client.aclose()
        server.close()


async def test_queues_are_bounded_and_a_full_client_refuses_at_once(valkey_server: ValkeyProcess) -> None:
    client = PipelinedValkey(Endpoint.from_url(valkey_server.url), 1.0, connections=1, max_pending=3)
    try:
        assert await client.execute(("SET", "k", "v")) == b"OK"
        admin(valkey_server).execute_command("CLIENT", "PAUSE", 1500, "WRITE")
        held = [asyncio.ensure_future(client.execute(("SET", "k", str(i)))) for i in range(3)]
        await asyncio.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(ValkeyConnectionError, match="full"):
            await client.execute(("SET", "k", "over"))
        assert time.monotonic() - started < 0.2
        admin(valkey_server).execute_command("CLIENT", "UNPAUSE")
        assert await asyncio.gather(*held) == [b"OK"] * 3
    finally:
        admin(valkey_server).execute_command("CLIENT", "UNPAUSE")
        await client.aclose()


async def test_a_script_the_server_lost_is_sent_again_in_full(
    client: PipelinedValkey, valkey_server: ValkeyProcess
) -> None:
    script = client.register_script(ECHO_READ)
    assert await script(keys=["k"], args=["one"]) == b"one"
    admin(valkey_server).script_flush()
    assert await script(keys=["k"], args=["two"]) == b"two"
    assert admin(valkey_server).script_exists(script.sha) == [True]


async def test_errors_are_valkey_py_exceptions(client: PipelinedValkey, valkey_server: ValkeyProcess) -> None:
    admin(valkey_server).set("string", "x")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await client.lrange("string", 0, -1)
    assert await client.ping()  # the connection is still in step after an error reply


async def test_auth_and_database_come_from_the_url() -> None:
    server = ValkeyProcess()
    server.start()
    admin(server).config_set("requirepass", "s3cret")
    try:
        good = PipelinedValkey.from_url(f"valkey://:s3cret@127.0.0.1:{server.port}/3", 1.0)
        assert await good.execute(("SET", "where", "db3")) == b"OK"
        assert await good.execute(("CLIENT", "INFO"), writes=False)  # the connection is authenticated
        sync: Any = valkey.Valkey(host="127.0.0.1", port=server.port, password="s3cret", db=3)
        assert sync.get("where") == b"db3"
        await good.aclose()
        bad = PipelinedValkey.from_url(f"valkey://:wrong@127.0.0.1:{server.port}/0", 1.0)
        with pytest.raises(ValkeyConnectionError, match="refused"):
            await bad.ping()
        await bad.aclose()
    finally:
        server.close()


async def test_a_unix_socket_url_connects(tmp_path: Any) -> None:
    socket_path = tmp_path / "v.sock"
    server = ValkeyProcess(extra_args=("--unixsocket", str(socket_path)))
    server.start()
    try:
        client = PipelinedValkey.from_url(f"unix://{socket_path}", 1.0)
        assert await client.ping()
        await client.aclose()
    finally:
        server.close()


@pytest.mark.parametrize(
    "url",
    [
        "valkey://h:1/0?socket_timeout=3",  # an option this client would ignore
        "valkey://h:1/0?ssl_cert_reqs=none",  # TLS options without TLS
        "valkeys://h:1/0?ssl_cert_reqs=sometimes",
    ],
)
def test_url_options_it_cannot_honour_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        Endpoint.from_url(url)


def test_tls_urls_make_a_verifying_context() -> None:
    endpoint = Endpoint.from_url("valkeys://user:pw@valkey.example:6380/2")
    assert endpoint.tls is not None and endpoint.tls.check_hostname
    where = (endpoint.server_hostname, endpoint.port, endpoint.db, endpoint.username)
    assert where == ("valkey.example", 6380, 2, "user")
    relaxed = Endpoint.from_url("rediss://h:1/0?ssl_cert_reqs=none")
    assert relaxed.tls is not None and not relaxed.tls.check_hostname


def test_pack_refuses_what_valkey_has_no_encoding_for() -> None:
    for bad in (True, None, object()):
        with pytest.raises(TypeError):
            pack(["SET", "k", bad])  # type: ignore[list-item]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.one_of(st.binary(max_size=300), st.text(max_size=100), st.integers()), max_size=8))
def test_any_argument_reaches_the_server_byte_for_byte(valkey_server: ValkeyProcess, values: list[Any]) -> None:
    """RPUSH then LRANGE through the client: what the server stored is exactly the argument's encoding."""

    async def round_trip() -> list[bytes]:
        client = PipelinedValkey.from_url(valkey_server.url, 2.0)
        try:
            await client.execute(("DEL", "prop"))
            if values:
                await client.execute(("RPUSH", "prop", *values))
            return await client.lrange("prop", 0, -1)
        finally:
            await client.aclose()

    expected = [v if isinstance(v, bytes) else str(v).encode() for v in values]
    assert asyncio.run(round_trip()) == expected


async def test_an_exclusive_connection_keeps_its_watch_and_is_closed_when_left_dirty(
    client: PipelinedValkey, valkey_server: ValkeyProcess
) -> None:
    """WATCH is the connection's state: a held connection sees its transaction aborted by a write made
    meanwhile on another, and carries out one nobody disturbed. One left with an error is not reused."""
    async with client.exclusive() as session:
        await session.run(("WATCH", "w"))
        await client.execute(("SET", "w", "changed"))  # on the shared write connection
        assert (await session.run(("MULTI",), ("GET", "w"), ("EXEC",)))[-1] is None
        await session.run(("WATCH", "w"))
        assert (await session.run(("MULTI",), ("GET", "w"), ("EXEC",)))[-1] == [b"changed"]
    with pytest.raises(ResponseError):
        async with client.exclusive() as session:
            await session.run(("WATCH", "w"), ("NOSUCHCOMMAND",))
    deadline = time.monotonic() + 5
    while [c for c in admin(valkey_server).client_list() if int(c.get("watch", 0))]:  # until the server sees it
        assert time.monotonic() < deadline, "a connection left watching was kept open"
        await asyncio.sleep(0.01)
    async with client.exclusive() as session:  # a fresh connection, nothing watched
        await client.execute(("SET", "w", "again"))
        assert (await session.run(("MULTI",), ("GET", "w"), ("EXEC",)))[-1] == [b"again"]
