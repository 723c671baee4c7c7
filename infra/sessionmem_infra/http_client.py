"""A small HTTP/1.1 keep-alive client, asyncio and blocking, for the few peers sessionmem talks to over
HTTP (the launcher's proxy, agent and summariser; the memory client's launcher).

Both ends of every agent turn's memory path run through here, where a general client library costs
more time per call and memory per process than the rest of the path (docs/benchmarks.md). This one does
only what those peers need:
Content-Length bodies (chunked answers are read too), pooled connections, answers bounded in size
(``max_answer_bytes``: a peer cannot make the caller hold more), and one retry of an idempotent request on
a pooled connection the server had already closed (nothing was received). Only an idempotent request is
retried: a POST is unless its caller says it is safe to repeat (an append whose message ids the store
deduplicates). What it does besides answering (connecting, retrying, failing) it logs at debug level.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

Headers = list[tuple[bytes, bytes]]
_READ_SIZE = 65536
_LOG = logging.getLogger("sessionmem.http")
# The largest answer (head and body) a client takes unless told otherwise: well above a whole exported
# conversation (its cap of entries at their largest), far below what would strain a pod's memory.
DEFAULT_MAX_ANSWER_BYTES = 64 * 1024 * 1024
# Methods whose request may be sent twice with the effect of once (RFC 9110, 9.2.2).
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class HttpError(OSError):
    """The peer could not be reached, or broke the exchange."""


class HttpTimeout(HttpError, TimeoutError):
    """The peer did not answer within the client's timeout."""


class AnswerTooLarge(HttpError):
    """The peer's answer exceeded the client's ``max_answer_bytes``; the connection was dropped."""


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: Headers
    body: bytes

    def header(self, name: bytes) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return None


@dataclass(slots=True)
class _ResponseReader:
    status: int = 0
    headers: Headers = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    complete: bool = False
    keep_alive: bool = False
    received: bool = False
    parser: Any = None
    # Bytes the answer may still take (head and body); feeding more raises AnswerTooLarge.
    allowance: int = DEFAULT_MAX_ANSWER_BYTES

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        # Asked here: once feed_data returns, httptools has reset and always answers False.
        self.keep_alive = bool(self.parser.should_keep_alive())

    def feed(self, data: bytes) -> None:
        """Feed what the socket returned; ``b""`` is the peer closing."""
        if not data:
            if not self.received:
                raise _NothingReceived
            self.parser.feed_data(b"")  # lets a close-delimited body complete, or raises
            if not self.complete:
                raise asyncio.IncompleteReadError(b"", None)
            return
        self.received = True
        self.allowance -= len(data)
        if self.allowance < 0:
            raise AnswerTooLarge("the answer exceeds the client's limit")
        self.parser.feed_data(data)

    def response(self) -> tuple[HttpResponse, bool]:
        status = self.parser.get_status_code()
        # The parser holds this reader (its callbacks) and the reader the parser: break the cycle so
        # both go with reference counting instead of waiting for a garbage collection.
        self.parser = None
        return HttpResponse(status, self.headers, b"".join(self.chunks)), self.keep_alive


def _new_reader(max_answer_bytes: int) -> _ResponseReader:
    state = _ResponseReader(allowance=max_answer_bytes)
    state.parser = httptools.HttpResponseParser(state)
    return state


_PEER_ERRORS = (OSError, asyncio.IncompleteReadError, httptools.HttpParserError)


class _NothingReceived(Exception):
    """The server closed the connection before answering (an idle keep-alive connection it dropped)."""


def _typed(method: str, target: str, exc: BaseException) -> HttpError:
    """The client's typed error for what broke an exchange."""
    failure = HttpTimeout if isinstance(exc, TimeoutError) else HttpError
    return failure(f"{method} {target}: {type(exc).__name__}")


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where requests go, and how each request's head is written."""

    host: str
    port: int
    ssl: ssl.SSLContext | None
    prefix: str
    host_header: bytes

    @classmethod
    def parse(cls, base_url: str) -> _Origin:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"unsupported URL {base_url!r}: http(s)://host[:port] expected")
        secure = parts.scheme == "https"
        port = parts.port or (443 if secure else 80)
        default_port = port == (443 if secure else 80)
        return cls(
            host=parts.hostname,
            port=port,
            ssl=ssl.create_default_context() if secure else None,
            prefix=parts.path.rstrip("/"),
            host_header=(parts.hostname if default_port else f"{parts.hostname}:{port}").encode(),
        )

    def message(self, method: str, target: str, headers: Iterable[tuple[bytes, bytes]], body: bytes | None) -> bytes:
        lines = [f"{method} {self.prefix}{target} HTTP/1.1".encode(), b"host: " + self.host_header]
        for name, value in headers:
            # Fail closed: a value carrying a line break would smuggle a header or a second request.
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name or b":" in name:
                raise ValueError(f"invalid HTTP header {name!r}")
            lines.append(name + b": " + value)
        lines.append(b"content-length: " + str(len(body) if body else 0).encode())
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        return head + body if body else head


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Connection(asyncio.Protocol):
    """One pooled connection. A protocol rather than asyncio streams: a stream read allocates a waiter
    and copies into its buffer on every chunk, this sets one future per answer.

    The timeout is one timer per connection that outlives the exchanges: arming a timer per request (what
    ``asyncio.timeout`` does) costs CPU on every call (docs/benchmarks.md), as the loop's heap fills with
    cancelled timers. When the timer fires it either expires the exchange under way, if that one is past its
    deadline, or re-arms for it; with no exchange under way it lapses."""

    __slots__ = ("_answered", "_deadline", "_reader", "_timer", "closed", "loop", "transport")

    def __init__(self) -> None:
        # The loop the connection was opened in: its transport and timer belong to that loop only.
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reader: _ResponseReader | None = None
        self._answered: asyncio.Future[None] | None = None
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses, so no isinstance check).
        self.transport = cast(asyncio.Transport, transport)

    def exchange(
        self, message: bytes, deadline: float | None, max_answer_bytes: int
    ) -> tuple[_ResponseReader, asyncio.Future[None]]:
        """Send ``message``; the answer is awaited on the returned future, which fails with
        :class:`HttpTimeout` at ``deadline`` (the loop's clock)."""
        assert self.transport is not None
        loop = self.loop
        self._reader = reader = _new_reader(max_answer_bytes)
        self._answered = answered = loop.create_future()
        if deadline is not None:
            self._deadline = deadline
            timer = self._timer
            # A timer left by an earlier exchange re-arms itself for this one when it fires, unless it
            # would fire after this deadline (then it is replaced): either way this exchange is bounded.
            if timer is None or timer.when() > deadline:
                if timer is not None:
                    timer.cancel()
                self._timer = loop.call_at(deadline, self._check_deadline)
        self.transport.write(message)
        return reader, answered

    def _check_deadline(self) -> None:
        self._timer = None
        if self._answered is None:
            return
        loop = self.loop
        if loop.time() >= self._deadline:
            self._settle(HttpTimeout("no answer in time"))
            self.close()
        else:
            self._timer = loop.call_at(self._deadline, self._check_deadline)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        if reader is None:  # bytes nobody asked for: the connection is out of step, never reuse it
            self.close()
            return
        try:
            reader.feed(data)
        except Exception as exc:  # handed to the waiting request, which types it
            self._settle(exc)
            return
        if reader.complete:
            self._settle(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reader = self._reader
        if reader is None:
            return
        try:
            reader.feed(b"")  # nothing received yet raises _NothingReceived: the request was not processed
        except Exception as error:
            self._settle(error)
            return
        self._settle(None)

    def _settle(self, exc: BaseException | None) -> None:
        answered, self._reader, self._answered = self._answered, None, None
        if answered is not None and not answered.done():
            if exc is None:
                answered.set_result(None)
            else:
                answered.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        loop = self.loop
        if not loop.is_closed() and _running_loop() is not loop:
            # Dropped from another loop's thread: the transport is closed by its own loop.
            loop.call_soon_threadsafe(self._close_now)
            return
        self._close_now()

    def _close_now(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            if self.loop.is_closed():
                # Its loop is gone (asyncio.run returned) and cannot run the transport's close: shut the
                # socket down so the peer sees the end now; its descriptor goes with the transport.
                sock = self.transport.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                return
            self.transport.close()


class HttpClient:
    """Requests to one origin (``http://host:port`` or ``https://...``) over pooled connections.

    ``timeout``: seconds from sending a request to its whole answer (:class:`HttpTimeout`); None leaves it
    to the caller. ``connect_timeout``: seconds to open a connection (:class:`HttpTimeout`); None: the
    ``timeout``. Without a bound, a peer whose address drops packets (a Service with no endpoint left)
    holds the caller for the kernel's whole SYN retry schedule, minutes. ``max_answer_bytes``: the largest
    answer taken (:class:`AnswerTooLarge` beyond it)."""

    def __init__(
        self,
        base_url: str,
        max_idle: int = 64,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        self._origin = _Origin.parse(base_url)
        self._idle: deque[_Connection] = deque()
        self._max_idle = max_idle
        self._timeout = timeout
        self._connect_timeout = timeout if connect_timeout is None else connect_timeout
        self._max_answer_bytes = max_answer_bytes

    async def request(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[bytes, bytes]] = (),
        body: bytes | None = None,
        idempotent: bool | None = None,
    ) -> HttpResponse:
        """The peer's answer. ``idempotent``: whether the request may be sent again when a pooled connection
        turns out closed; None: as its method says (``IDEMPOTENT_METHODS``)."""
        message = self._origin.message(method, target, headers, body)
        retryable = method in IDEMPOTENT_METHODS if idempotent is None else idempotent
        loop = asyncio.get_running_loop()
        # One deadline for the whole call (connecting, a resend, the answer): never waits past the timeout.
        deadline = None if self._timeout is None else loop.time() + self._timeout
        for attempt in (0, 1):
            connection = self._pooled(loop)
            reused = connection is not None
            if connection is None:
                connection = await self._connect(loop, deadline)
            try:
                reader, answered = connection.exchange(message, deadline, self._max_answer_bytes)
                await answered
                response, keep = reader.response()
            except (*_PEER_ERRORS, _NothingReceived) as exc:
                connection.close()
                if reused and attempt == 0 and retryable and isinstance(exc, _NothingReceived):
                    # The peer dropped idle connections (its keep-alive timeout): the others in the pool
                    # are as old, so retry once on a fresh connection.
                    _LOG.debug("%s %s: pooled connection closed by the peer, sending again", method, target)
                    self._drop_idle()
                    continue
                _LOG.debug("%s %s failed: %r", method, target, exc)
                if isinstance(exc, AnswerTooLarge):
                    raise
                raise _typed(method, target, exc) from exc
            except BaseException:
                connection.close()  # cancelled (a timeout): the connection is mid-exchange, drop it
                raise
            if keep and not connection.closed and len(self._idle) < self._max_idle:
                self._idle.append(connection)
            else:
                connection.close()
            return response
        raise HttpError(f"{method} {target}: connection closed")  # pragma: no cover - loop always returns

    def _pooled(self, loop: asyncio.AbstractEventLoop) -> _Connection | None:
        """An idle connection of this event loop. A connection belongs to the loop that opened it (its
        transport and timer run there): called from another loop (``asyncio.run`` again, a framework's
        ``run_sync``), the pool is of no use and is dropped."""
        idle = self._idle
        while idle:
            connection = idle.pop()
            if connection.loop is not loop:
                connection.close()
                self._drop_idle()
                return None
            if not connection.closed:  # the peer may have closed it while it sat idle
                return connection
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> _Connection:
        origin = self._origin
        connect_timeout = self._connect_timeout
        if deadline is not None:
            left = max(0.0, deadline - loop.time())
            connect_timeout = left if connect_timeout is None else min(connect_timeout, left)
        try:
            async with asyncio.timeout(connect_timeout):
                _, connection = await loop.create_connection(
                    _Connection,
                    origin.host,
                    origin.port,
                    ssl=origin.ssl,
                    server_hostname=origin.host if origin.ssl else None,
                )
        except TimeoutError as exc:
            _LOG.debug("connecting to %s:%d timed out", origin.host, origin.port)
            raise HttpTimeout(f"cannot connect to {origin.host}:{origin.port} in time") from exc
        except OSError as exc:
            _LOG.debug("connecting to %s:%d failed: %r", origin.host, origin.port, exc)
            raise HttpError(f"cannot connect to {origin.host}:{origin.port}: {exc.strerror or exc}") from exc
        _LOG.debug("connected to %s:%d", origin.host, origin.port)
        return connection

    def _drop_idle(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def aclose(self) -> None:
        self._drop_idle()


class BlockingHttpClient:
    """The same, for blocking callers, over plain sockets. Safe to share between threads: a connection is
    taken out of the pool for the whole exchange.

    ``timeout``: seconds for each send or receive (a socket timeout); ``connect_timeout``: seconds to
    connect, None: the ``timeout``; ``max_answer_bytes``: the largest answer taken."""

    def __init__(
        self,
        base_url: str,
        max_idle: int = 16,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        self._origin = _Origin.parse(base_url)
        self._idle: deque[socket.socket] = deque()
        self._max_idle = max_idle
        self._timeout = timeout
        self._connect_timeout = timeout if connect_timeout is None else connect_timeout
        self._max_answer_bytes = max_answer_bytes

    def request(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[bytes, bytes]] = (),
        body: bytes | None = None,
        idempotent: bool | None = None,
    ) -> HttpResponse:
        """As :meth:`HttpClient.request`."""
        message = self._origin.message(method, target, headers, body)
        retryable = method in IDEMPOTENT_METHODS if idempotent is None else idempotent
        for attempt in (0, 1):
            try:
                sock = self._idle.pop()
                reused = True
            except IndexError:
                sock, reused = self._connect(), False
            try:
                sock.sendall(message)
                response, keep = self._read(sock, self._max_answer_bytes)
            except (*_PEER_ERRORS, _NothingReceived) as exc:
                sock.close()
                if reused and attempt == 0 and retryable and isinstance(exc, _NothingReceived):
                    _LOG.debug("%s %s: pooled connection closed by the peer, sending again", method, target)
                    self._drop_idle()  # as the asyncio client: the peer dropped its idle connections
                    continue
                _LOG.debug("%s %s failed: %r", method, target, exc)
                if isinstance(exc, AnswerTooLarge):
                    raise
                raise _typed(method, target, exc) from exc
            except BaseException:
                sock.close()  # interrupted mid-exchange (KeyboardInterrupt): the connection is unusable
                raise
            if keep and len(self._idle) < self._max_idle:
                self._idle.append(sock)
            else:
                sock.close()
            return response
        raise HttpError(f"{method} {target}: connection closed")  # pragma: no cover - loop always returns

    def _connect(self) -> socket.socket:
        origin = self._origin
        try:
            sock = socket.create_connection((origin.host, origin.port), timeout=self._connect_timeout)
            sock.settimeout(self._timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if origin.ssl is not None:
                sock = origin.ssl.wrap_socket(sock, server_hostname=origin.host)
        except TimeoutError as exc:
            raise HttpTimeout(f"cannot connect to {origin.host}:{origin.port} in time") from exc
        except OSError as exc:
            raise HttpError(f"cannot connect to {origin.host}:{origin.port}: {exc.strerror or exc}") from exc
        return sock

    @staticmethod
    def _read(sock: socket.socket, max_answer_bytes: int) -> tuple[HttpResponse, bool]:
        state = _new_reader(max_answer_bytes)
        while not state.complete:
            try:
                data = sock.recv(_READ_SIZE)
            except (ConnectionResetError, BrokenPipeError) as exc:
                if not state.received:
                    raise _NothingReceived from exc
                raise
            state.feed(data)
        return state.response()

    def _drop_idle(self) -> None:
        while self._idle:
            self._idle.pop().close()

    def close(self) -> None:
        self._drop_idle()
