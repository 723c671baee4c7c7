"""A lean asyncio client for one standalone Valkey server: the few commands the store runs, pipelined.

Why not valkey-py's asyncio client on the hot path: per command it checks a connection out of its pool, packs
the command in Python and reads the reply through asyncio streams, tens of CPU µs for a command the server
answers in a few. Here a command is packed in C (``libvalkey.pack_command``), written together with the other
commands issued in the same loop iteration (a few writes, not one each), on one multiplexed connection; its reply,
parsed in C by ``libvalkey.Reader``, resolves the oldest pending future, because RESP answers the commands of
one connection in order.

What stays exactly as with valkey-py (``decode_responses=False``), so ``ConversationStore`` maps failures in
one place (``_guard``) and reads replies unchanged:

- the URL is read by valkey-py's own ``parse_url`` (credentials become AUTH, the database SELECT, ``?ssl_*``
  the TLS context, through valkey-py's ``ValkeySSLContext``);
- error replies become the exceptions valkey-py's parser makes of them (``-NOSCRIPT`` NoScriptError,
  ``-LOADING`` BusyLoadingError, others ResponseError), by the same ``parse_error``;
- failures of the connection are ``valkey.exceptions.ConnectionError``, a command without a reply in time
  ``valkey.exceptions.TimeoutError``;
- replies are bytes, ints, lists and None; PING is True, SCAN ``(int cursor, [keys])``.

One connection per client, opened on first use: ``max_connections`` is accepted for ``connect()``'s signature
and always honoured, since one is never more than it allows. The client belongs to the event loop of its first
command (as valkey-py's connections do).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, cast

import libvalkey
from valkey._parsers import BaseParser
from valkey.asyncio.connection import SSLConnection, UnixDomainSocketConnection, ValkeySSLContext, parse_url
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import DataError, InvalidResponse, NoScriptError, ValkeyError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

Arg = str | bytes | int | float

# A batch being coalesced is written once it holds this many commands, without waiting for the loop iteration
# to end: the server starts on the first ones while the loop still makes the rest, instead of the two taking
# turns (measured with 64 appends in flight: 48k -> 75k/s at the same CPU per command; 4 or fewer costs CPU).
_FLUSH_EVERY: Final = 16

# Whatever gets() returns when the buffer holds no complete reply; never a reply itself.
_MORE: Final = object()

# URL query options that change nothing here: pooling and health checks have no counterpart on one
# pipelined connection. Any other unknown option is refused rather than silently dropped (fail closed:
# a mistyped TLS option must not become a connection with weaker checks).
_IGNORED_URL_OPTIONS: Final = frozenset(
    {"max_connections", "health_check_interval", "retry_on_timeout", "socket_keepalive", "client_name"}
)
_SSL_URL_OPTIONS: Final = {
    "ssl_keyfile": "keyfile",
    "ssl_certfile": "certfile",
    "ssl_cert_reqs": "cert_reqs",
    "ssl_ca_certs": "ca_certs",
    "ssl_ca_data": "ca_data",
    "ssl_check_hostname": "check_hostname",
    "ssl_ciphers": "ciphers",
}


# valkey-py's own mapping of error replies to exception classes (untyped there, hence the cast).
_parse_error: Final = cast(Callable[[str], Exception], BaseParser.parse_error)


def pack(args: Sequence[Arg]) -> bytes:
    """One command in RESP. valkey-py refuses what it cannot encode (None, bool...) with DataError; so here."""
    try:
        return libvalkey.pack_command(tuple(args))
    except TypeError as exc:
        raise DataError(f"Invalid input in command {args[:1]!r}: {exc}") from exc


class _Connection(asyncio.Protocol):
    """One connection: a FIFO of (future, deadline) per command written, resolved in order by the replies."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float, address: str) -> None:
        self.loop = loop
        self.timeout = timeout
        self.address = address
        self.broken = False
        self.closed: asyncio.Future[None] = loop.create_future()
        self._transport: asyncio.Transport | None = None
        self._pending: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._reader = libvalkey.Reader(protocolError=InvalidResponse, replyError=_parse_error, notEnoughData=_MORE)

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        loop = self.loop
        fut: asyncio.Future[Any] = loop.create_future()
        if self.broken:
            fut.set_exception(ValkeyConnectionError(f"Connection to {self.address} is closed"))
            return fut
        deadline = loop.time() + self.timeout
        pending = self._pending
        if not pending and self._transport is not None:
            # Nothing in flight, so likely nothing else to send this iteration: write now rather than spend a
            # loop iteration (and its epoll) on the flush.
            self._transport.write(packed)
        else:
            # Commands in flight: the ones issued in this loop iteration (concurrent requests woken by the same
            # read) leave together, a few writes instead of one syscall each.
            out = self._out
            out.append(packed)
            if len(out) >= _FLUSH_EVERY:
                self._write_out()
            elif not self._flush_scheduled:
                self._flush_scheduled = True
                loop.call_soon(self._flush)
        pending.append((fut, deadline))
        if self._timer is None:
            # One timer per connection, not per command: the oldest pending command has the nearest deadline.
            self._timer = loop.call_at(deadline, self._check_deadline)
        return fut

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._write_out()

    def _write_out(self) -> None:
        out = self._out
        if not out:
            return
        self._out = []
        if self._transport is not None and not self.broken:
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _check_deadline(self) -> None:
        self._timer = None
        if self.broken or not self._pending:
            return
        deadline = self._pending[0][1]
        if deadline > self.loop.time():
            self._timer = self.loop.call_at(deadline, self._check_deadline)
            return
        # Fail closed: the oldest command has no reply in time. A reply arriving later would answer the
        # command behind it, so the connection is dropped with everything on it; the next command reconnects.
        self.drop(f"Timeout reading from {self.address}", timed_out=True)

    def drop(self, reason: str, timed_out: bool = False) -> None:
        """Fail every pending command and close: the first with TimeoutError when it timed out, the rest
        (and all of them otherwise) with ConnectionError, as their replies can no longer be paired."""
        if self.broken:
            return
        self.broken = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._out = []
        pending, self._pending = self._pending, deque()
        for index, (fut, _) in enumerate(pending):
            if not fut.done():
                error: ValkeyError = (
                    ValkeyTimeoutError(reason)
                    if timed_out and index == 0
                    else ValkeyConnectionError(f"{reason}: connection dropped")
                )
                fut.set_exception(error)
        if self._transport is not None:
            self._transport.abort()

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        pending = self._pending
        while True:
            try:
                reply = reader.gets()
            except InvalidResponse as exc:
                # Fail closed: a stream that does not parse cannot be paired with commands any more.
                self.drop(f"Protocol error from {self.address}: {exc}")
                return
            if reply is _MORE:
                return
            if not pending:
                self.drop(f"Reply without a command from {self.address}")
                return
            fut = pending.popleft()[0]
            if fut.done():
                continue  # its caller gave up (cancelled); the reply is consumed all the same, keeping the order
            if isinstance(reply, Exception):
                fut.set_exception(reply)
            else:
                fut.set_result(reply)

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself, and connection_lost fails what is pending

    def connection_lost(self, exc: Exception | None) -> None:
        detail = f" ({exc})" if exc else ""
        self.drop(f"Connection to {self.address} closed{detail}")
        self._transport = None
        if not self.closed.done():
            self.closed.set_result(None)


class Script:
    """``register_script``'s result: EVALSHA, and on NOSCRIPT (a restarted or flushed server) SCRIPT LOAD and
    once more, as valkey-py's ``Script`` does."""

    __slots__ = ("_client", "script", "sha")

    def __init__(self, client: RespClient, script: str | bytes) -> None:
        self._client = client
        self.script = script
        encoded = script.encode() if isinstance(script, str) else script
        self.sha = hashlib.sha1(encoded, usedforsecurity=False).hexdigest()

    def __call__(self, keys: Sequence[Arg] | None = None, args: Sequence[Arg] | None = None) -> Awaitable[Any]:
        return self._run(keys or (), args or ())

    async def _run(self, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        client = self._client
        try:
            return await client.execute_packed(pack((b"EVALSHA", self.sha, len(keys), *keys, *args)))
        except NoScriptError:
            self.sha = (await client.execute_packed(pack((b"SCRIPT", b"LOAD", self.script)))).decode()
            return await client.execute_packed(pack((b"EVALSHA", self.sha, len(keys), *keys, *args)))


class RespClient:
    """Standalone Valkey over one pipelined connection; see the module docstring for what it keeps of
    valkey-py. Every call is bounded: connecting (with AUTH and SELECT) by ``connect_timeout``, each command
    by ``timeout``."""

    def __init__(
        self,
        *,
        host: str = "localhost",
        port: int = 6379,
        path: str | None = None,
        ssl: ValkeySSLContext | None = None,
        username: str | None = None,
        password: str | None = None,
        db: int = 0,
        timeout: float,
        connect_timeout: float | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._path = path
        self._ssl = ssl
        self._username = username
        self._password = password
        self._db = db
        self._timeout = timeout
        self._connect_timeout = timeout if connect_timeout is None else connect_timeout
        self.address = path if path is not None else f"{host}:{port}"
        self._conn: _Connection | None = None
        self._connecting: asyncio.Task[_Connection] | None = None

    @classmethod
    def from_url(cls, url: str, timeout_seconds: float) -> RespClient:
        """``valkey://``, ``redis://``, ``valkeys://``/``rediss://`` (TLS) and ``unix://`` URLs, read as
        valkey-py reads them (``?socket_timeout=`` in the URL wins over ``timeout_seconds``, as there)."""
        options: dict[str, Any] = dict(parse_url(url))
        connection_class = options.pop("connection_class", None)
        timeout = float(options.pop("socket_timeout", options.pop("timeout", timeout_seconds)))
        connect_timeout = float(options.pop("socket_connect_timeout", timeout))
        ssl_options = {ctx_name: options.pop(name) for name, ctx_name in _SSL_URL_OPTIONS.items() if name in options}
        ssl: ValkeySSLContext | None = None
        if connection_class is SSLConnection:
            # valkey-py's defaults for valkeys://: certificates required, host names not checked.
            ssl_options.setdefault("cert_reqs", "required")
            ssl = ValkeySSLContext(**ssl_options)
        elif ssl_options:
            raise ValueError(f"TLS options {sorted(ssl_options)} in a URL without TLS")
        path = options.pop("path", None) if connection_class is UnixDomainSocketConnection else None
        known = {"host", "port", "username", "password", "db", "path"}
        unknown = set(options) - known - _IGNORED_URL_OPTIONS
        if unknown:
            raise ValueError(f"unsupported Valkey URL options: {sorted(unknown)}")
        return cls(
            host=options.get("host", "localhost"),
            port=int(options.get("port", 6379)),
            path=path,
            ssl=ssl,
            username=options.get("username"),
            password=options.get("password"),
            db=int(options.get("db", 0)),
            timeout=timeout,
            connect_timeout=connect_timeout,
        )

    # ---- what the store uses ----

    def register_script(self, script: str | bytes) -> Script:
        return Script(self, script)

    def lrange(self, name: str | bytes, start: int, end: int) -> Awaitable[list[bytes]]:
        return self.execute_packed(pack((b"LRANGE", name, start, end)))

    async def scan(
        self, cursor: int = 0, match: str | bytes | None = None, count: int | None = None
    ) -> tuple[int, list[bytes]]:
        args: list[Arg] = [b"SCAN", cursor]
        if match is not None:
            args += [b"MATCH", match]
        if count is not None:
            args += [b"COUNT", count]
        next_cursor, keys = await self.execute_packed(pack(args))
        return int(next_cursor), keys

    async def ping(self) -> bool:
        return bool(await self.execute_packed(pack((b"PING",))) == b"PONG")

    def execute_command(self, *args: Arg) -> Awaitable[Any]:
        """Any command, its reply as the server sent it (no valkey-py response callbacks)."""
        return self.execute_packed(pack(args))

    def execute_packed(self, packed: bytes) -> Awaitable[Any]:
        conn = self._conn
        if conn is not None and not conn.broken:
            return conn.send(packed)  # the hot path: no coroutine, the caller awaits the reply's future
        return self._execute_after_connecting(packed)

    async def aclose(self) -> None:
        """Close the connection; commands still pending fail with ConnectionError. A later command opens a
        new connection, as with valkey-py."""
        if self._connecting is not None:
            # Not cancelled: the commands waiting on it would see a CancelledError they did not ask for. It is
            # bounded by the connect timeout; its failure is theirs to see, not aclose's.
            with contextlib.suppress(ValkeyError):
                await asyncio.shield(self._connecting)
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.drop(f"Connection to {self.address} closed by the client")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(conn.closed), self._timeout)

    # ---- connecting ----

    async def _execute_after_connecting(self, packed: bytes) -> Any:
        conn = await self._connection()
        return await conn.send(packed)

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and not conn.broken:
            return conn
        task = self._connecting
        if task is None:
            # One attempt shared by every command that finds no connection: a server that does not answer
            # costs each of them one connect timeout, not one per command queued before it.
            task = asyncio.get_running_loop().create_task(self._open())
            task.add_done_callback(_retrieve_exception)
            self._connecting = task
        return await asyncio.shield(task)

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        conn: _Connection | None = None

        def factory() -> _Connection:
            return _Connection(loop, self._timeout, self.address)

        try:
            async with asyncio.timeout(self._connect_timeout):
                if self._path is not None:
                    _, conn = await loop.create_unix_connection(factory, self._path)
                else:
                    ssl = self._ssl.get() if self._ssl is not None else None
                    _, conn = await loop.create_connection(factory, self._host, self._port, ssl=ssl)
                await self._handshake(conn)
        except TimeoutError as exc:
            if conn is not None:
                conn.drop("Timeout connecting")
            raise ValkeyTimeoutError(f"Timeout connecting to {self.address}") from exc
        except OSError as exc:
            raise ValkeyConnectionError(f"Error {exc.errno} connecting to {self.address}. {exc.strerror}.") from exc
        except (ValkeyConnectionError, ValkeyTimeoutError):
            if conn is not None:
                conn.drop("Handshake failed")
            raise
        except ValkeyError as exc:
            assert conn is not None
            conn.drop("Handshake failed")
            # Fail closed, and retryable: a server refusing our AUTH/SELECT is unusable as configured.
            raise ValkeyConnectionError(f"{self.address} refused the connection set-up: {exc}") from exc
        finally:
            if self._connecting is asyncio.current_task():
                self._connecting = None
        self._conn = conn
        return conn

    async def _handshake(self, conn: _Connection) -> None:
        sent: list[asyncio.Future[Any]] = []
        if self._username or self._password:
            credentials = (self._username, self._password or "") if self._username else (self._password or "",)
            sent.append(conn.send(pack((b"AUTH", *credentials))))
        if self._db:
            sent.append(conn.send(pack((b"SELECT", self._db))))
        for reply in sent:
            if await reply != b"OK":
                raise ValkeyConnectionError(f"{self.address} did not accept the connection set-up")


def _retrieve_exception(task: asyncio.Task[Any]) -> None:
    # The commands awaiting a shared connect may all be cancelled; its failure is theirs, not worth a log line.
    if not task.cancelled():
        task.exception()
