"""The proxy's client for a standalone Valkey: concurrent requests' commands share a few connections,
are written together and their replies parsed together.

Why the proxy owns this much: it sends one short command per request from many concurrent requests.
valkey-py's asyncio client (used before, and still used for a Valkey Cluster) gives each command a
pooled connection, a write and a read of its own, and several timeouts; that cost the proxy more CPU per
request than the rest of the request together (docs/benchmarks.md). Here the RESP encoding and
parsing stay a library's (libvalkey, valkey-py's own C parser) and the exceptions are valkey-py's; what
this module owns is connection handling, tested in tests/proxy/test_resp_client.py against a real valkey-server.

Isolation, so that one tenant's slow command never fails another's request:

- Every command has its own deadline and its own timer. A command past it fails alone (TimeoutError);
  its reply, when it comes, is dropped, and the connection it was on stays in use.
- Commands the server may hold (writes, held by ``CLIENT PAUSE WRITE`` during a failover) run on
  connections of their own, apart from reads, so a held write never delays a read queued behind it. A
  script declared ``#!lua flags=no-writes`` is a read.
- A connection that stays silent for a whole timeout while commands wait on it gets no new commands;
  once nothing waits on it any more it is closed (a dead peer), and another is opened when needed.
- Bounded: at most ``max_pending`` commands wait on one connection and at most ``connections``
  connections are open per kind, so a command finding them all full fails at once (ConnectionError:
  the caller answers 503) instead of queueing without end.
- A transaction that needs WATCH (whose state is the connection's) runs on a connection held by it
  alone (``exclusive``): at most ``connections`` of them, kept open between uses.

Nothing is retried except a script the server does not know (NOSCRIPT: loaded, then run again).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import libvalkey
from valkey.asyncio.connection import parse_url
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import NoScriptError, OutOfMemoryError, ResponseError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

Arg = bytes | str | int | float

# Past this many commands waiting on every open connection of a kind, another connection is opened
# (up to the limit): deep enough that a busy proxy batches well, shallow enough that one large reply
# delays few others.
SPREAD_AT = 16
DEFAULT_CONNECTIONS = 4
DEFAULT_MAX_PENDING = 4096
_SSL_OPTIONS = frozenset({"ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"})
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def pack(args: Sequence[Arg]) -> bytes:
    """One command in RESP: an array of bulk strings, encoded by libvalkey (C). It is on the path of
    every command, where building it in Python cost more than the rest of the client. A bool, None or
    any other type Valkey has no encoding for is refused with a TypeError."""
    packed: bytes = libvalkey.pack_command(args if type(args) is tuple else tuple(args))
    return packed


def _error(reply: ResponseError) -> ResponseError:
    message = str(reply)
    if message.startswith("NOSCRIPT"):
        return NoScriptError(message)
    if message.startswith("OOM"):
        return OutOfMemoryError(message)
    return reply


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how to connect, from a ``valkey://``, ``valkeys://``, ``redis(s)://`` or ``unix://`` URL."""

    host: str = "localhost"
    port: int = 6379
    path: str | None = None
    tls: ssl.SSLContext | None = None
    server_hostname: str | None = None
    username: str | None = None
    password: str | None = None
    db: int = 0

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        options: dict[str, Any] = dict(parse_url(url))
        connection_class = options.pop("connection_class", None)
        tls_options = {name: options.pop(name) for name in list(options) if name in _SSL_OPTIONS}
        unknown = set(options) - {"host", "port", "path", "username", "password", "db"}
        if unknown:
            # Failing closed: an option this client would silently ignore (a timeout, a protocol version)
            # must not look accepted.
            raise ValueError(f"unsupported Valkey URL option(s): {', '.join(sorted(unknown))}")
        tls = None
        if connection_class is not None and connection_class.__name__ == "SSLConnection":
            tls = _tls_context(tls_options)
        elif tls_options:
            raise ValueError("ssl_* options need a valkeys:// or rediss:// URL")
        host = str(options.get("host") or "localhost")
        return cls(
            host=host,
            port=int(options.get("port") or 6379),
            path=options.get("path"),
            tls=tls,
            server_hostname=host if tls is not None and tls.check_hostname else None,
            username=options.get("username"),
            password=options.get("password"),
            db=int(options.get("db") or 0),
        )

    def handshake(self) -> list[bytes]:
        commands: list[bytes] = []
        if self.password is not None:
            auth: list[Arg] = ["AUTH", self.username, self.password] if self.username else ["AUTH", self.password]
            commands.append(pack(auth))
        if self.db:
            commands.append(pack(["SELECT", self.db]))
        return commands


def _tls_context(options: dict[str, Any]) -> ssl.SSLContext:
    """The TLS settings of the URL's ssl_* options. A file that cannot be read is a ValueError naming the
    option and the path (the proxy exits at start-up: a mounted Secret with another key name is the usual
    cause), never a connection with fewer checks."""
    try:
        return _load_tls_context(options)
    except (OSError, ssl.SSLError) as error:
        files = {name: options[name] for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile") if options.get(name)}
        named = ", ".join(f"{name}={path}" for name, path in files.items())
        raise ValueError(f"cannot load the Valkey TLS files ({named}): {error}") from error


def _load_tls_context(options: dict[str, Any]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
    requirement = str(options.get("ssl_cert_reqs", "required")).lower()
    if requirement not in _CERT_REQS:
        raise ValueError(f"ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}")
    check_hostname = str(options.get("ssl_check_hostname", "true")).lower() not in ("false", "0", "no")
    context.check_hostname = check_hostname and requirement != "none"
    context.verify_mode = _CERT_REQS[requirement]
    if options.get("ssl_certfile"):
        context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
    return context


class _Connection(asyncio.Protocol):
    """One connection: commands are answered in the order sent, so replies resolve the oldest waiter."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float, max_pending: int) -> None:
        self._loop = loop
        self._timeout = timeout
        self._max_pending = max_pending
        self._reader = libvalkey.Reader(replyError=ResponseError)
        self._transport: asyncio.Transport | None = None
        # Oldest first: (future, its timer). A future already done (expired) still takes its reply.
        self._waiting: collections.deque[tuple[asyncio.Future[Any], asyncio.TimerHandle]] = collections.deque()
        self._outgoing: list[bytes] = []
        self._flush_scheduled = False
        self._heard_at = loop.time()
        self.live = 0  # waiters not yet answered or expired
        self.closed = False
        self.silent = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)
        self._heard_at = self._loop.time()

    def data_received(self, data: bytes) -> None:
        self._heard_at = self._loop.time()
        self.silent = False
        reader = self._reader
        reader.feed(data)
        waiting = self._waiting
        while True:
            try:
                reply = reader.gets()
            except Exception as exc:  # a protocol error: nothing after it can be matched to its command
                self._fail(ValkeyConnectionError(f"Valkey protocol error: {exc}"))
                return
            if reply is False:
                return
            if not waiting:
                self._fail(ValkeyConnectionError("Valkey sent a reply nobody asked for"))
                return
            future, timer = waiting.popleft()
            if future.done():
                continue  # expired: its request has been answered already
            timer.cancel()
            self.live -= 1
            if isinstance(reply, ResponseError):
                future.set_exception(_error(reply))
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ValkeyConnectionError(f"connection to Valkey lost: {exc or 'closed by the server'}"))

    # the client's side

    @property
    def usable(self) -> bool:
        return not self.closed and not self.silent and len(self._waiting) < self._max_pending

    def send(self, command: bytes) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = self._loop.create_future()
        timer = self._loop.call_at(self._loop.time() + self._timeout, self._expire, future)
        self._waiting.append((future, timer))
        self.live += 1
        self._outgoing.append(command)
        if not self._flush_scheduled:
            # Everything sent in this turn of the event loop leaves in one write.
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return future

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.close()
        self._fail(ValkeyConnectionError("client closed"))

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed or self._transport is None:
            return
        outgoing, self._outgoing = self._outgoing, []
        self._transport.write(b"".join(outgoing))

    def _expire(self, future: asyncio.Future[Any]) -> None:
        if future.done():
            return
        future.set_exception(ValkeyTimeoutError(f"no reply from Valkey within {self._timeout:g}s"))
        self.live -= 1
        if self._loop.time() - self._heard_at >= self._timeout:
            # Nothing heard for a whole timeout with work outstanding: held or dead. Send nothing more
            # here; once nothing waits on it, close it.
            self.silent = True
        if self.silent and self.live == 0:
            self.close()

    def _fail(self, error: Exception) -> None:
        self.closed = True
        waiting, self._waiting = self._waiting, collections.deque()
        self._outgoing = []
        self.live = 0
        for future, timer in waiting:
            timer.cancel()
            if not future.done():
                future.set_exception(error)
        if self._transport is not None:
            self._transport.abort()


class _Lane:
    """The connections of one kind (reads, or writes), opened as the load needs them."""

    def __init__(self, client: PipelinedValkey) -> None:
        self._client = client
        self._connections: list[_Connection] = []
        self._opening: asyncio.Task[_Connection] | None = None

    def ready(self) -> _Connection | None:
        """The least busy usable connection (opening another past ``SPREAD_AT``), or None when the command
        must wait for one being opened: most commands find one, and then no coroutine runs."""
        connections = self._connections
        best: _Connection | None = None
        stale = False
        for candidate in connections:
            if candidate.closed:
                stale = True
            elif candidate.usable and (best is None or candidate.live < best.live):
                best = candidate
        if stale:
            connections = self._connections = [c for c in connections if not c.closed]
        limit = self._client.connections
        if best is not None:
            if best.live >= SPREAD_AT and len(connections) < limit and self._opening is None:
                self._start_opening()
            return best
        if len(connections) >= limit and self._opening is None:
            raise ValkeyConnectionError("every Valkey connection is full or unresponsive")
        if self._opening is None:
            self._start_opening()
        return None

    async def opened(self) -> _Connection:
        """The connection being opened, once it is."""
        assert self._opening is not None
        return await asyncio.shield(self._opening)

    def _start_opening(self) -> None:
        task = asyncio.ensure_future(self._client.open_connection())
        self._opening = task
        task.add_done_callback(self._opened)

    def _opened(self, task: asyncio.Task[_Connection]) -> None:
        self._opening = None
        if not task.cancelled() and task.exception() is None:
            self._connections.append(task.result())

    def close(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
        for connection in self._connections:
            connection.close()
        self._connections = []


class Script:
    """A Lua script run by its digest (EVALSHA); loaded (SCRIPT LOAD) and run again when the server does
    not have it (a restarted or promoted server). EVAL is never sent: the chart's ACL does not allow it.
    A script flagged ``no-writes`` runs as EVALSHA_RO, which a server pausing writes (CLIENT PAUSE WRITE,
    as during a failover) still answers, as it answers LRANGE."""

    def __init__(self, client: PipelinedValkey, text: str) -> None:
        self._client = client
        self._text = text.encode()
        self.sha = hashlib.sha1(self._text, usedforsecurity=False).hexdigest()
        first_line = text.lstrip().split("\n", 1)[0]
        self.writes = not (first_line.startswith("#!lua") and "no-writes" in first_line)

    async def __call__(self, keys: Sequence[Arg] = (), args: Sequence[Arg] = ()) -> Any:
        command = ("EVALSHA" if self.writes else "EVALSHA_RO", self.sha, len(keys), *keys, *args)
        try:
            return await self._client.execute(command, writes=self.writes)
        except NoScriptError:
            await self._client.execute(("SCRIPT", "LOAD", self._text), writes=self.writes)
            return await self._client.execute(command, writes=self.writes)


class Session:
    """A connection held by one caller (``PipelinedValkey.exclusive``), for commands whose state is the
    connection's (WATCH, MULTI/EXEC)."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    async def run(self, *commands: Sequence[Arg]) -> list[Any]:
        """The replies of ``commands``, sent in one write. An error reply is raised (the first, once every
        reply is in); a queued command's error is left in EXEC's reply as it is."""
        futures = [self._connection.send(pack(command)) for command in commands]
        replies = await asyncio.gather(*futures, return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies


class PipelinedValkey:
    """What the store needs of a Valkey client (``store.ValkeyLike``), for one standalone server."""

    def __init__(
        self,
        endpoint: Endpoint,
        timeout_seconds: float,
        connections: int = DEFAULT_CONNECTIONS,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        if connections < 1:
            raise ValueError("connections must be at least 1")
        self.endpoint = endpoint
        self.timeout = timeout_seconds
        self.connections = connections
        self.max_pending = max_pending
        self._reads = _Lane(self)
        self._writes = _Lane(self)
        self._held: list[_Connection] = []
        self._holders: asyncio.Semaphore | None = None

    @classmethod
    def from_url(cls, url: str, timeout_seconds: float, connections: int = DEFAULT_CONNECTIONS) -> PipelinedValkey:
        return cls(Endpoint.from_url(url), timeout_seconds, connections)

    def execute(self, command: Sequence[Arg], writes: bool = True) -> Awaitable[Any]:
        """The reply of ``command``, to await. Sent at once on a ready connection, whose future is returned
        as it is: no coroutine around it, on the path of every command."""
        lane = self._writes if writes else self._reads
        connection = lane.ready()
        if connection is None:
            return self._execute_when_opened(lane, command)
        return connection.send(pack(command))

    @staticmethod
    async def _execute_when_opened(lane: _Lane, command: Sequence[Arg]) -> Any:
        connection = await lane.opened()
        return await connection.send(pack(command))

    async def open_connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        endpoint = self.endpoint
        protocol = _Connection(loop, self.timeout, self.max_pending)
        try:
            async with asyncio.timeout(self.timeout):
                if endpoint.path is not None:
                    await loop.create_unix_connection(lambda: protocol, endpoint.path)
                else:
                    await loop.create_connection(
                        lambda: protocol,
                        endpoint.host,
                        endpoint.port,
                        ssl=endpoint.tls,
                        server_hostname=endpoint.server_hostname,
                    )
                for command in endpoint.handshake():
                    await protocol.send(command)
        except TimeoutError as exc:
            protocol.close()
            raise ValkeyTimeoutError(f"connecting to Valkey took over {self.timeout:g}s") from exc
        except OSError as exc:
            protocol.close()
            raise ValkeyConnectionError(f"cannot connect to Valkey: {exc}") from exc
        except ResponseError as exc:  # AUTH or SELECT refused: a misconfiguration, unavailable until fixed
            protocol.close()
            raise ValkeyConnectionError(f"Valkey refused the connection: {exc}") from exc
        except BaseException:
            protocol.close()
            raise
        return protocol

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[Session]:
        """A connection for the caller alone until it leaves (at most ``connections`` at once; waiting for
        one at most the timeout). Kept for the next caller when left clean (no command outstanding, no
        error), closed otherwise: its WATCH or MULTI state is then unknown."""
        if self._holders is None:
            self._holders = asyncio.Semaphore(self.connections)
        try:
            async with asyncio.timeout(self.timeout):
                await self._holders.acquire()
        except TimeoutError as exc:
            raise ValkeyTimeoutError(f"no Valkey connection free within {self.timeout:g}s") from exc
        connection: _Connection | None = None
        try:
            while self._held and connection is None:
                candidate = self._held.pop()
                if candidate.usable and candidate.live == 0:
                    connection = candidate
                else:
                    candidate.close()
            if connection is None:
                connection = await self.open_connection()
            yield Session(connection)
            if connection.usable and connection.live == 0:
                self._held.append(connection)
                connection = None
        finally:
            if connection is not None:
                connection.close()
            self._holders.release()

    def register_script(self, script: str) -> Script:
        return Script(self, script)

    async def lrange(self, name: str, start: int, end: int) -> list[bytes]:
        reply: list[bytes] = await self.execute(("LRANGE", name, start, end), writes=False)
        return reply

    async def scan(
        self, cursor: int = 0, match: str | None = None, count: int | None = None
    ) -> tuple[int, list[bytes]]:
        command: list[Arg] = ["SCAN", cursor]
        if match is not None:
            command += ["MATCH", match]
        if count is not None:
            command += ["COUNT", count]
        next_cursor, keys = await self.execute(command, writes=False)
        return int(next_cursor), list(keys)

    async def ping(self) -> bool:
        reply = await self.execute(("PING",), writes=False)
        return bool(reply == b"PONG")

    async def aclose(self) -> None:
        self._reads.close()
        self._writes.close()
        for connection in self._held:
            connection.close()
        self._held = []
