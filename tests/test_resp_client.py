"""RespClient against a real valkey-server: the replies and exceptions valkey-py gives, NOSCRIPT recovery,
AUTH and SELECT from the URL, TLS, a killed or paused server (typed errors, then a reconnect), and replies
that stay paired with their commands with many in flight, cancelled or timed out."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, cast

import pytest
import uvloop
import valkey
import valkey.asyncio as valkey_async
from valkey.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    DataError,
    NoScriptError,
    ResponseError,
    ValkeyError,
)
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

from sessionmem_core.errors import BackendUnavailable
from sessionmem_core.resp_client import RespClient
from sessionmem_core.store import ConversationStore, NewEntry
from sessionmem_core.valkey_client import connect
from tests.harness.pki import generate_pki
from tests.support.valkey import ValkeyProcess, free_port

ENTRY = b'{"id":"m","v":1,"role":"assistant","content":"' + b"x" * 220 + b'","author":"a/b","ts":1}'

# A script whose reply has every shape a Lua script can give: ints, bulk and status strings, nil, nested lists.
SHAPES = """
return {1, -7, 'bulk', redis.status_reply('FINE'), false, {2, {'deep', false}}, {}, redis.call('LINDEX', KEYS[1], 0)}
"""


class Admin(Protocol):
    """The typed subset of valkey-py's sync client used here to set up and look at the server."""

    def execute_command(self, *args: Any) -> Any: ...
    def rpush(self, name: str, *values: bytes) -> int: ...
    def set(self, name: str, value: str | int) -> bool: ...
    def get(self, name: str) -> bytes | None: ...
    def llen(self, name: str) -> int: ...
    def script_flush(self) -> bool: ...
    def config_set(self, name: str, value: str) -> bool: ...


def sync_client(server: ValkeyProcess, **kwargs: Any) -> Admin:
    return cast(Admin, valkey.Valkey(host="127.0.0.1", port=server.port, socket_timeout=5, **kwargs))


def valkey_py(url: str) -> Any:
    """The standalone client connect() made before RespClient (Any: its stubs type replies sync-or-async)."""
    return valkey_async.Valkey.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0, health_check_interval=0)


@pytest.fixture
async def resp(valkey_server: ValkeyProcess) -> AsyncIterator[RespClient]:
    client = RespClient.from_url(valkey_server.url, 2.0)
    yield client
    await client.aclose()


def _pause(server: ValkeyProcess, millis: int) -> None:
    sync_client(server).execute_command("CLIENT", "PAUSE", millis, "ALL")


async def _error_of(awaitable: Any) -> tuple[type[BaseException], str]:
    try:
        await awaitable
    except ValkeyError as exc:
        return type(exc), str(exc)
    raise AssertionError("no error")


# ---- the same values as valkey-py ----


async def test_every_command_the_store_uses_answers_as_valkey_py(valkey_server: ValkeyProcess) -> None:
    admin = sync_client(valkey_server)
    admin.rpush("mem:a/b:list", *[ENTRY] * 500)
    admin.set("mem:a/b:string", "s")
    for i in range(30):
        admin.set(f"mem:x/y:k{i}", i)
    ours, theirs = RespClient.from_url(valkey_server.url, 2.0), valkey_py(valkey_server.url)
    try:
        for client in (ours, theirs):
            assert await client.ping() is True
        for start, end in ((-40, -1), (0, -1), (-1, -1), (5, 2)):
            assert await ours.lrange("mem:a/b:list", start, end) == await theirs.lrange("mem:a/b:list", start, end)
        assert await ours.lrange("mem:a/b:missing", 0, -1) == [] == await theirs.lrange("mem:a/b:missing", 0, -1)
        assert await ours.scan(0, match="mem:a/b:*", count=1000) == await theirs.scan(0, match="mem:a/b:*", count=1000)
        assert await ours.scan(0) == await theirs.scan(0)
        first_page = await ours.scan(cursor=0, match="mem:x/y:*", count=5)
        assert first_page == await theirs.scan(cursor=0, match="mem:x/y:*", count=5)
        assert isinstance(first_page[0], int) and all(isinstance(k, bytes) for k in first_page[1])

        shapes = await ours.register_script(SHAPES)(keys=["mem:a/b:list"])
        assert shapes == await theirs.register_script(SHAPES)(keys=["mem:a/b:list"])
        assert shapes == [1, -7, b"bulk", b"FINE", None, [2, [b"deep", None]], [], ENTRY]

        # Error replies: the same classes and messages.
        wrongtype = [await _error_of(c.lrange("mem:a/b:string", 0, -1)) for c in (ours, theirs)]
        assert wrongtype[0] == wrongtype[1] and wrongtype[0][0] is ResponseError and "WRONGTYPE" in wrongtype[0][1]
        loading = "return redis.error_reply('LOADING Valkey is loading the dataset in memory')"
        errors = [await _error_of(c.register_script(loading)(keys=["k"])) for c in (ours, theirs)]
        assert errors[0] == errors[1] and errors[0][0] is BusyLoadingError
        script_bug = "return redis.call('NOSUCHCOMMAND')"
        assert (await _error_of(ours.register_script(script_bug)()))[0] is ResponseError
        with pytest.raises(DataError):
            await ours.lrange(None, 0, -1)  # type: ignore[arg-type]
    finally:
        await ours.aclose()
        await theirs.aclose()


async def test_the_store_gives_the_same_results_on_both_clients(valkey_server: ValkeyProcess) -> None:
    results: list[list[Any]] = []
    for name, client in (("ours", connect(valkey_server.url, 2.0)), ("theirs", valkey_py(valkey_server.url))):
        store = ConversationStore(client)
        key = f"mem:t/{name}:c1"
        seen: list[Any] = []
        try:
            await store.ping()
            seen.append(await store.append(key, [NewEntry("user", "hi", "m1")], "t/a", cap=3, ttl_seconds=60))
            seen.append(await store.append(key, [NewEntry("user", "hi", "m1")], "t/a", cap=3, ttl_seconds=60))
            for i in range(4):
                seen.append(await store.append(key, [NewEntry("assistant", f"a{i}", f"a{i}")], "t/a", 3, 60))
            read = await store.read(key, 2)
            seen.append((read.version, [e.split(b',"ts":')[0] for e in read.raw_entries]))
            seen.append((await store.read(key, 0)).version)
            seen.append(len((await store.read_with_summary(key, 2)).raw_entries))
            seen.append(await store.info(key))
            seen.append(await store.info(f"mem:t/{name}:missing"))
            seen.append([k.split(":")[-1] for k in (await store.scan(f"mem:t/{name}:*", 0, 100))[1]])
            seen.append(len((await store.read_all(key)).raw_entries))
            seen.append(await store.replace(key, [NewEntry("user", "new", "n1")], "t/a", None, 3, 60))
            seen.append(await store.delete(key))
            seen.append(await store.delete(key))
        finally:
            await client.aclose()
        results.append(seen)
    assert results[0] == results[1]
    assert results[0][1].duplicate and results[0][-2] == 1


# ---- scripts ----


async def test_noscript_after_script_flush_loads_the_script_and_retries(
    valkey_server: ValkeyProcess, resp: RespClient
) -> None:
    script = resp.register_script("return ARGV[1] .. KEYS[1]")
    assert await script(keys=["k"], args=["v"]) == b"vk"
    sync_client(valkey_server).script_flush()
    # Many callers at once after the flush: each meets NOSCRIPT, loads and retries; all get their own answer.
    answers = await asyncio.gather(*(script(keys=[f"k{i}"], args=[i]) for i in range(50)))
    assert answers == [f"{i}k{i}".encode() for i in range(50)]
    # A script the server never saw is NoScriptError, as valkey-py makes it.
    assert (await _error_of(resp.execute_command("EVALSHA", "0" * 40, 0)))[0] is NoScriptError


# ---- AUTH, SELECT, unix socket, TLS ----


async def test_auth_and_select_come_from_the_url(valkey_server: ValkeyProcess) -> None:
    admin = sync_client(valkey_server)
    admin.execute_command("ACL", "SETUSER", "proxy", "on", ">s3cret", "~mem:*", "+@all")
    admin.config_set("requirepass", "defaultpw")
    port = valkey_server.port

    user = RespClient.from_url(f"valkey://proxy:s3cret@127.0.0.1:{port}/3", 2.0)
    default = RespClient.from_url(f"redis://:defaultpw@127.0.0.1:{port}/2", 2.0)
    wrong = connect(f"valkey://proxy:nope@127.0.0.1:{port}/0", 2.0)
    anonymous = connect(f"valkey://127.0.0.1:{port}/0", 2.0)
    try:
        await user.register_script("redis.call('SET', KEYS[1], 'three')")(keys=["mem:db"])
        await default.register_script("redis.call('SET', KEYS[1], 'two')")(keys=["mem:db"])
        check = sync_client(valkey_server, password="defaultpw")
        assert check.execute_command("SELECT", 3) and check.get("mem:db") == b"three"
        assert check.execute_command("SELECT", 2) and check.get("mem:db") == b"two"
        assert check.execute_command("SELECT", 0) and check.get("mem:db") is None
        # The ACL applies: the user may touch only mem:* keys.
        assert (await _error_of(user.lrange("other", 0, -1)))[0].__name__ == "NoPermissionError"

        assert (await _error_of(wrong.ping()))[0] is AuthenticationError
        assert (await _error_of(anonymous.ping()))[0] is AuthenticationError
        with pytest.raises(BackendUnavailable):
            await ConversationStore(wrong).ping()
    finally:
        for client in (user, default, wrong, anonymous):
            await client.aclose()


async def test_unix_socket_url(tmp_path: Path) -> None:
    sock = tmp_path / "v.sock"
    server = ValkeyProcess(extra_args=("--unixsocket", str(sock), "--unixsocketperm", "700"))
    server.start()
    client = connect(f"unix://{sock}?db=4", 2.0)
    try:
        store = ConversationStore(client)
        await store.append("mem:u/x:c", [NewEntry("user", "over a socket")], "u/x", 10, 60)
        assert len((await store.read("mem:u/x:c", 5)).raw_entries) == 1
        assert sync_client(server, db=4).llen("mem:u/x:c") == 1 and sync_client(server).llen("mem:u/x:c") == 0
    finally:
        await client.aclose()
        server.close()


@contextlib.asynccontextmanager
async def tls_relay(tmp_path: Path, backend_port: int) -> AsyncIterator[tuple[int, Path]]:
    """TLS in front of the plain valkey-server (the embedded build has no TLS): (port, CA file)."""
    pki = generate_pki(tmp_path / "pki")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.serving_cert, pki.serving_key)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        backend_reader, backend_writer = await asyncio.open_connection("127.0.0.1", backend_port)
        await asyncio.gather(pipe(client_reader, backend_writer), pipe(backend_reader, client_writer))

    port = free_port()
    server = await asyncio.start_server(relay, "127.0.0.1", port, ssl=context)
    try:
        yield port, pki.ca_cert
    finally:
        server.close()


async def test_tls_url_verifies_the_server_certificate(valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    async with tls_relay(tmp_path, valkey_server.port) as (port, ca):
        trusted = connect(f"valkeys://127.0.0.1:{port}/0?ssl_ca_certs={ca}", 2.0)
        untrusted = connect(f"rediss://127.0.0.1:{port}/0", 2.0)  # valkey-py's default: certificates required
        unchecked = connect(f"valkeys://127.0.0.1:{port}/0?ssl_cert_reqs=none", 2.0)
        plaintext = connect(f"valkey://127.0.0.1:{port}/0", 0.5)
        try:
            store = ConversationStore(trusted)
            await store.append("mem:tls/a:c", [NewEntry("user", "over TLS")], "tls/a", 10, 60)
            assert len((await store.read("mem:tls/a:c", 5)).raw_entries) == 1
            assert await unchecked.ping() is True
            error, message = await _error_of(untrusted.ping())
            assert issubclass(error, ValkeyConnectionError) and "CERTIFICATE_VERIFY_FAILED" in message
            assert issubclass((await _error_of(plaintext.ping()))[0], ValkeyConnectionError | ValkeyTimeoutError)
        finally:
            for client in (trusted, untrusted, unchecked, plaintext):
                await client.aclose()


def test_url_options_that_would_change_the_meaning_are_refused() -> None:
    with pytest.raises(ValueError, match="decode_responses"):
        RespClient.from_url("valkey://h:1/0?decode_responses=true", 1.0)
    with pytest.raises(ValueError, match="TLS options"):
        RespClient.from_url("valkey://h:1/0?ssl_cert_reqs=none", 1.0)
    # Pool options mean nothing on one connection and are accepted, as valkey-py's URLs may carry them.
    RespClient.from_url("valkey://h:1/0?health_check_interval=5&max_connections=10", 1.0)


# ---- faults: killed, paused, unreachable ----


async def test_server_killed_mid_flight_fails_the_commands_then_reconnects_after_restart(
    valkey_server: ValkeyProcess,
) -> None:
    sync_client(valkey_server).rpush("mem:k/a:c", ENTRY)
    client = RespClient.from_url(valkey_server.url, 5.0)
    try:
        assert await client.lrange("mem:k/a:c", 0, -1) == [ENTRY]
        _pause(valkey_server, 10_000)
        in_flight = [asyncio.ensure_future(client.lrange("mem:k/a:c", 0, -1)) for _ in range(20)]
        await asyncio.sleep(0.2)
        assert not any(f.done() for f in in_flight)
        started = time.monotonic()
        await asyncio.to_thread(valkey_server.kill)
        outcomes = await asyncio.gather(*in_flight, return_exceptions=True)
        assert all(isinstance(o, ValkeyConnectionError) for o in outcomes), outcomes
        assert time.monotonic() - started < 2.0
        # Down: refused at once, typed.
        with pytest.raises(ValkeyConnectionError):
            await client.ping()
        with pytest.raises(BackendUnavailable):
            await ConversationStore(client).read("mem:k/a:c", 5)

        await asyncio.to_thread(valkey_server.start)
        assert await client.ping() is True
        assert await client.lrange("mem:k/a:c", 0, -1) == []  # a fresh server (no persistence)
    finally:
        await client.aclose()


async def test_a_command_past_its_timeout_fails_and_the_connection_stays_usable(
    valkey_server: ValkeyProcess,
) -> None:
    admin = sync_client(valkey_server)
    admin.rpush("mem:p/a:c", b"one", b"two")
    client = RespClient.from_url(valkey_server.url, 0.3)
    try:
        assert await client.ping() is True
        _pause(valkey_server, 1200)
        started = time.monotonic()
        first = asyncio.ensure_future(client.lrange("mem:p/a:c", 0, -1))
        await asyncio.sleep(0.1)
        behind = asyncio.ensure_future(client.execute_command("ECHO", "behind"))
        with pytest.raises(ValkeyTimeoutError):
            await first
        assert 0.25 < time.monotonic() - started < 1.0
        # Queued behind it on the same connection: dropped with it, never answered by the late reply.
        with pytest.raises(ValkeyConnectionError):
            await behind
        with pytest.raises(BackendUnavailable):
            await ConversationStore(client).read("mem:p/a:c", 5)

        await asyncio.sleep(1.3)  # the pause is over
        assert await client.execute_command("ECHO", "after") == b"after"
        assert await client.lrange("mem:p/a:c", 0, -1) == [b"one", b"two"]
        assert await client.ping() is True
    finally:
        await client.aclose()


async def test_an_unresponsive_server_costs_one_bounded_connect_shared_by_every_caller() -> None:
    # Accepts connections (the kernel's backlog) but never answers: the AUTH of the handshake hangs.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        port = sock.getsockname()[1]
        client = RespClient.from_url(f"valkey://:pw@127.0.0.1:{port}/0", 0.3)
        started = time.monotonic()
        outcomes = await asyncio.gather(*(client.ping() for _ in range(50)), return_exceptions=True)
        elapsed = time.monotonic() - started
        await client.aclose()
    assert all(isinstance(o, ValkeyTimeoutError) for o in outcomes), outcomes
    assert elapsed < 1.0, elapsed


async def test_connection_refused_is_a_connection_error() -> None:
    client = connect(f"valkey://127.0.0.1:{free_port()}/0", 0.5)
    with pytest.raises(ValkeyConnectionError, match=r"connecting to 127\.0\.0\.1"):
        await client.ping()
    with pytest.raises(BackendUnavailable):
        await ConversationStore(client).ping()
    await client.aclose()


async def test_aclose_fails_what_is_pending_and_a_later_command_reconnects(valkey_server: ValkeyProcess) -> None:
    client = RespClient.from_url(valkey_server.url, 2.0)
    connecting = [asyncio.ensure_future(client.ping()) for _ in range(5)]
    await asyncio.sleep(0)
    assert client._connecting is not None
    await client.aclose()
    # Closed while connecting: the waiters see the close as a ConnectionError, never a CancelledError.
    outcomes = await asyncio.gather(*connecting, return_exceptions=True)
    assert all(o is True or isinstance(o, ValkeyConnectionError) for o in outcomes), outcomes
    _pause(valkey_server, 300)
    pending = asyncio.ensure_future(client.ping())
    await asyncio.sleep(0.05)
    await client.aclose()
    with pytest.raises(ValkeyConnectionError):
        await pending
    assert await client.execute_command("ECHO", "again") == b"again"
    await client.aclose()


# ---- many in flight ----


async def test_many_concurrent_commands_each_get_their_own_reply(
    valkey_server: ValkeyProcess, resp: RespClient
) -> None:
    admin = sync_client(valkey_server)
    for k in range(16):
        admin.rpush(f"mem:c/a:{k}", *[f"{k}-{i}".encode() for i in range(50)])
    admin.set("mem:c/a:string", "s")
    echo = resp.register_script("return {KEYS[1], ARGV[1]}")
    rng = random.Random(7)

    async def worker(w: int) -> None:
        for n in range(60):
            choice = rng.randrange(4)
            if choice == 0:
                k, i = rng.randrange(16), rng.randrange(50)
                assert await resp.lrange(f"mem:c/a:{k}", i, i) == [f"{k}-{i}".encode()]
            elif choice == 1:
                assert await echo(keys=[f"w{w}"], args=[n]) == [f"w{w}".encode(), str(n).encode()]
            elif choice == 2:
                with pytest.raises(ResponseError, match="WRONGTYPE"):
                    await resp.lrange("mem:c/a:string", 0, -1)
            else:
                # Replies of every size, some split across reads.
                payload = f"{w}:{n}|" * rng.randrange(1, 3000)
                assert await resp.execute_command("ECHO", payload) == payload.encode()

    await asyncio.gather(*(worker(w) for w in range(200)))


async def test_cancelled_callers_do_not_shift_the_replies(valkey_server: ValkeyProcess, resp: RespClient) -> None:
    for round_ in range(20):
        futures = [asyncio.ensure_future(resp.execute_command("ECHO", f"{round_}-{i}")) for i in range(100)]
        for i in range(0, 100, 3):
            futures[i].cancel()
        for i, fut in enumerate(futures):
            if i % 3:
                assert await fut == f"{round_}-{i}".encode()
    # Tasks cancelled while waiting (the reply arrives after): the next commands still get their own.
    _pause(valkey_server, 300)
    waiting = [asyncio.ensure_future(resp.execute_command("ECHO", "late")) for _ in range(10)]
    await asyncio.sleep(0.05)
    for task in waiting:
        task.cancel()
    assert [await resp.execute_command("ECHO", f"next-{i}") for i in range(3)] == [b"next-0", b"next-1", b"next-2"]


# ---- the proxy's loop ----


@pytest.mark.parametrize(
    "scenario",
    [
        test_the_store_gives_the_same_results_on_both_clients,
        test_server_killed_mid_flight_fails_the_commands_then_reconnects_after_restart,
        test_a_command_past_its_timeout_fails_and_the_connection_stays_usable,
    ],
)
def test_the_same_under_uvloop(
    valkey_server: ValkeyProcess, scenario: Callable[[ValkeyProcess], Awaitable[None]]
) -> None:
    """The proxy serves on uvloop, whose transports differ from asyncio's: the fault paths once more there."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario(valkey_server))  # type: ignore[arg-type]


def test_ordering_under_uvloop(valkey_server: ValkeyProcess) -> None:
    async def scenario() -> None:
        client = RespClient.from_url(valkey_server.url, 2.0)
        try:
            await test_many_concurrent_commands_each_get_their_own_reply(valkey_server, client)
            await test_cancelled_callers_do_not_shift_the_replies(valkey_server, client)
        finally:
            await client.aclose()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())
