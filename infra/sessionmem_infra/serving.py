"""How the proxy and the launcher serve HTTP on granian (Rust/hyper, its RSGI interface), alike: granian's
settings from the serving limits, and the per-request limits hyper does not enforce itself.

What hyper enforces (docs/limits.md): a request head larger than its read buffer (431, no body), more than
100 headers (431, no body), a head not complete within the header timeout, an idle keep-alive connection
past that same timer (hyper starts it whenever it waits for a head), malformed requests (400), in-order
answers to pipelined requests. What ``RequestLimits`` adds, with typed bodies: header count and bytes (431),
URL length (414), body size (413) and body timeout (408); the app counts its requests in flight (503).
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from granian.http import HTTP1Settings
from granian.rsgi import HTTPProtocol, ProtocolClosed, ProtocolError, Scope

from sessionmem_core import api
from sessionmem_core.env import ServingLimits
from sessionmem_core.errors import (
    HeadersTooLarge,
    InvalidRequest,
    MalformedRequest,
    PayloadTooLarge,
    RequestTimeout,
    SessionMemError,
    UriTooLong,
    error_body,
)

if TYPE_CHECKING:  # the launcher serves with this module and never loads pydantic
    from pydantic import BaseModel

# hyper's smallest read buffer; a head must fit in the buffer, so it is also the smallest header limit.
MIN_READ_BUFFER = 8192

JSON = "application/json"
JSON_HEADERS = [("content-type", JSON)]
# Answers after which the connection is not reused: the request's body (or more) may be left unread on it.
_CLOSING = frozenset({408, 413, 414, 431})
CONNECTION_CLOSE = ("connection", "close")
# Header fields a request may carry once only: who calls, for which scope, turn or conversation, and how
# the request is framed (``_refuse_repeated``). Content-Length is hyper's: it refuses two different values
# and keeps one of a repeated one.
SINGLE_VALUED = frozenset(
    {
        "authorization",
        "host",
        "transfer-encoding",
        "expect",
        "content-type",
        api.CONVERSATION_ID_HEADER,
        api.USER_CAPABILITY_HEADER,
        api.TURN_HEADER,
        api.TRACEPARENT_HEADER,
    }
)
_DOT_SEGMENTS = frozenset({".", ".."})
_JSON_AND_CLOSE = [*JSON_HEADERS, CONNECTION_CLOSE]


def http1_settings(limits: ServingLimits) -> HTTP1Settings:
    """hyper has one timer for "waiting for a request head", started on a new connection and after each
    answer: it bounds a trickled head (slowloris) and an idle keep-alive connection alike, so it is the
    stricter of the two limits. The whole head must fit in the read buffer: over it, hyper answers 431."""
    wait = min(limits.header_timeout_seconds, limits.idle_timeout_seconds)
    return HTTP1Settings(
        header_read_timeout=max(1, round(wait * 1000)),
        keep_alive=True,
        max_buffer_size=max(MIN_READ_BUFFER, limits.max_header_bytes),
    )


def open_connections(limits: ServingLimits) -> int:
    """granian's cap on the connections a worker holds open (its ``backpressure``: a permit taken before
    each accept and held for the connection's life; further ones wait in the listen backlog). Twice the
    requests allowed in flight, so a request over that limit still reaches the app and gets its typed 503
    instead of waiting unanswered; and never more than the process's file descriptors allow.

    Past its descriptor limit granian's accept loop spins: accept fails (EMFILE), the permit is given
    back, and accept is tried again at once, leaving the connection in the backlog and the worker's CPU
    busy (docs/limits.md). Capped below that limit it never reaches it: the connections past the cap wait
    in the backlog with no CPU spent on them."""
    return max(1, min(2 * limits.max_connections, descriptor_limit() - RESERVED_DESCRIPTORS))


# Descriptors a server process keeps for what is not a client's connection: its listening sockets, its
# Valkey, Kubernetes API and telemetry connections, its logs and the runtime's own files.
RESERVED_DESCRIPTORS = 128


def descriptor_limit() -> int:
    """How many files this process may hold open, its soft limit first raised to the hard one (which
    needs no privilege): a container's default soft limit is often far below what it is allowed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _UNBOUNDED
    target = _UNBOUNDED if hard == resource.RLIM_INFINITY else hard
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError):
            pass  # the kernel's own ceiling (fs.nr_open) is lower: keep the soft limit
    return soft


_UNBOUNDED = 1 << 20


class BodyMeter:
    """How many bytes of a request body the server has taken so far."""

    __slots__ = ("received",)

    def __init__(self) -> None:
        self.received = 0


class RequestLimits:
    """The per-request checks of one listener that need the parsed head or the body."""

    __slots__ = ("_body_deadlines", "serving")

    def __init__(self, serving: ServingLimits) -> None:
        self.serving = serving
        self._body_deadlines = Deadlines(serving.body_timeout_seconds)

    def check_head(self, scope: Scope) -> dict[str, str]:
        """The request's header fields by name; 414 for a URL over the limit, 431 for too many header
        fields or too many header bytes, 400 for a field whose value is not visible ASCII, and a
        ``malformed_request`` 400 (closing the connection) for a head that is not framed or routed as one
        reading of it (``check_framing``, ``check_path``).

        granian hands over the decoded path: its UTF-8 length is at most the raw target's (each escape
        is three bytes for one), and the raw head as a whole is bounded by hyper's buffer before this.
        It also leaves out of ``items()`` a value it cannot decode (``capé`` in Latin-1) while still
        listing its name: a credential sent that way would silently become an absent one, so the
        request is refused instead."""
        limits = self.serving
        path, query, headers = scope.path, scope.query_string, scope.headers
        if len(path.encode()) + len(query) + (1 if query else 0) > limits.max_url_bytes:
            raise UriTooLong(f"the request target exceeds {limits.max_url_bytes} bytes")
        fields = headers.items()
        if len(fields) > limits.max_header_count:
            raise HeadersTooLarge(f"more than {limits.max_header_count} header fields")
        size = 4 * len(fields)  # "name: value\r\n"
        for name, value in fields:
            size += len(name) + len(value)
        if size > limits.max_header_bytes:
            raise HeadersTooLarge(f"header fields exceed {limits.max_header_bytes} bytes")
        by_name = dict(fields)
        names = headers.keys()
        if len(names) != len(by_name):
            unreadable = sorted(set(names).difference(by_name))
            raise InvalidRequest(f"header field {', '.join(unreadable)}: the value is not visible ASCII")
        if len(fields) != len(by_name):
            _refuse_repeated(fields)
        check_framing(by_name, scope.http_version)
        check_path(path)
        return by_name

    async def read_body(
        self,
        proto: HTTPProtocol,
        content_length: str | None,
        chunked: bool,
        meter: BodyMeter | None = None,
        expect_continue: bool = False,
    ) -> bytes:
        """The whole body, at most ``max_body_bytes``, all of it within ``body_timeout_seconds``.
        ``meter`` counts every byte taken, kept or dropped, also when this raises.

        Over the limit (declared or counted) nothing more is kept, but what the client is still sending
        is read and dropped, up to as much again and within the body timeout: closing on unread bytes
        makes the kernel reset the connection, and a client still uploading would then never read its
        413. Memory stays bounded by the limit; time by the body timeout. A client that asked to be told
        first (``Expect: 100-continue``, ``expect_continue``) is refused a declared length over the limit
        before anything is read, so it never hears 100 Continue: hyper sends that only once the body is
        first read.

        A chunked body must end with its last chunk: granian hands over a body cut short (or carrying
        trailers, which nothing here uses) as an empty chunk before the one that ends it, and either is
        refused rather than taken for the whole body."""
        meter = meter or BodyMeter()
        declared = content_length is not None and content_length.isascii() and content_length.isdigit()
        if content_length == "0" or (not declared and not chunked):
            return b""  # nothing to wait for: asking granian for the body would cost a hand-off
        limit = self.serving.max_body_bytes
        too_large = declared and int(content_length or 0) > limit
        if too_large and expect_continue:
            raise PayloadTooLarge(f"request body would exceed {limit} bytes")
        chunks: list[bytes] = []
        ends = 0
        try:
            with self._body_deadlines.timeout():
                if declared and not too_large:
                    # A declared length within the limit bounds what hyper hands over (it frames the body
                    # by that length): one hand-off for the whole body, where iterating costs one per
                    # chunk and one more to learn the body ended. It also tells a body cut short (the
                    # client went away, or broken framing) from a whole one, which iterating does not.
                    try:
                        body = await proto()
                    except (ProtocolClosed, ProtocolError) as exc:
                        raise InvalidRequest("the request body ended before its declared length") from exc
                    meter.received = len(body)
                    return body
                async for chunk in proto:
                    if not chunk:
                        ends += 1
                        continue
                    meter.received += len(chunk)
                    too_large = too_large or meter.received > limit
                    if not too_large:
                        chunks.append(chunk)
                    elif meter.received > 2 * limit:
                        break
        except TimeoutError as exc:
            if not too_large:
                raise RequestTimeout(
                    f"request body not received within {self.serving.body_timeout_seconds:g} s"
                ) from exc
        if too_large:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        if ends > 1:
            raise InvalidRequest("the chunked request body ended before its last chunk")
        return b"".join(chunks)


def _refuse_repeated(fields: list[tuple[str, str]]) -> None:
    """Fail-closed: two values of a field that decides who calls, for which scope or conversation, or how
    the request is framed leave two readings of the request (hyper keeps both, a lookup takes one)."""
    seen: set[str] = set()
    for name, _value in fields:
        if name in SINGLE_VALUED and name in seen:
            raise MalformedRequest(f"header field {name} is repeated: it must be sent once")
        seen.add(name)


def check_framing(by_name: dict[str, str], http_version: str) -> None:
    """RFC 9112 as a server must apply it where hyper is lenient (docs/limits.md): an HTTP/1.1 request
    without Host is refused (3.2); a transfer coding other than ``chunked`` alone (``identity``,
    ``gzip, chunked``, ``chunked`` twice) is refused with a 400 rather than the 501 the RFC suggests for a
    coding not understood. (hyper itself frames a request with both Transfer-Encoding and Content-Length
    by the former, drops the latter and closes the connection after the answer, as 6.1 allows.)"""
    if http_version == "1.1" and "host" not in by_name:
        raise MalformedRequest("an HTTP/1.1 request needs a Host header field")
    coding = by_name.get("transfer-encoding")
    if coding is not None and coding.strip().lower() != "chunked":
        raise MalformedRequest(f"Transfer-Encoding {coding!r}: only a single 'chunked' is accepted")


def check_path(path: str) -> None:
    """A decoded path with a ``.`` or ``..`` segment is refused, never resolved nor passed on: granian hands
    over the path percent-decoded, so ``/a%2F..%2Fb`` and ``/a/../b`` look alike here, and whatever reads
    the path after this (a route table, an agent behind the launcher) must see no segment that
    climbs."""
    if "/." in path:
        for segment in path.split("/"):
            if segment in _DOT_SEGMENTS:
                raise MalformedRequest("the path has a '.' or '..' segment (also when sent as %2E or after %2F)")


def closes_connection(status: int) -> bool:
    return status in _CLOSING


def json_headers(status: int) -> list[tuple[str, str]]:
    return _JSON_AND_CLOSE if status in _CLOSING else JSON_HEADERS


def respond(proto: HTTPProtocol, status: int, body: bytes, headers: list[tuple[str, str]] | None = None) -> None:
    proto.response_bytes(status, JSON_HEADERS if headers is None else headers, body)


def respond_error(proto: HTTPProtocol, error: SessionMemError) -> None:
    proto.response_bytes(error.status, [*json_headers(error.status), *error.headers()], error.body())


# --- Timeouts of one length for many concurrent waits, on one event-loop timer.
#
# ``asyncio.timeout`` arms a loop timer when a wait starts and cancels it when the wait ends. On a path every
# request takes (reading a request body), arming and cancelling that timer cost more CPU than the rest of the
# read (docs/benchmarks.md). Deadlines of one length pass in the order they were set, so one timer, armed
# for the oldest wait still under way, serves them all: starting a wait is a dict insertion, ending it a
# removal, and the timer is re-armed only when it fires.
#
# ``Deadlines(seconds).timeout()`` is used as ``asyncio.timeout(seconds)`` is, with a plain ``with`` (entering
# and leaving it awaits nothing): the block's task is cancelled once the deadline passes, the block then
# raising TimeoutError. A cancellation
# that is not the deadline's (the request's task cancelled from outside) propagates as it would.

# The loop's timers fire to the millisecond: a wait due within this margin counts as passed when the timer
# fires, rather than re-arming a timer for a fraction of a millisecond.
_MARGIN_SECONDS = 0.001


class Deadlines:
    """The deadlines of the waits under way, oldest first, and the one timer that expires them."""

    __slots__ = ("_loop", "_pending", "_timer", "seconds")

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"a timeout must be positive, not {seconds!r}")
        self.seconds = seconds
        # Insertion order is deadline order (one length for all): the first key is the oldest wait.
        self._pending: dict[TaskTimeout, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def timeout(self) -> TaskTimeout:
        """A ``with`` block, in a task, that raises TimeoutError once ``seconds`` have passed since it began."""
        return TaskTimeout(self)

    @property
    def waiting(self) -> int:
        """How many waits are under way."""
        return len(self._pending)

    def _start(self, wait: TaskTimeout) -> float:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Another loop (a new worker's, a test's): the old loop's timer and waits are not this one's.
            self._loop, self._pending, self._timer = loop, {}, None
        deadline = loop.time() + self.seconds
        self._pending[wait] = None
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        return deadline

    def _end(self, wait: TaskTimeout) -> None:
        self._pending.pop(wait, None)

    def _expire(self) -> None:
        self._timer = None
        loop, pending = self._loop, self._pending
        assert loop is not None
        now = loop.time() + _MARGIN_SECONDS
        while pending:
            oldest = next(iter(pending))
            if oldest.deadline > now:
                self._timer = loop.call_at(oldest.deadline, self._expire)
                return
            del pending[oldest]
            oldest.expire()


class TaskTimeout:
    """One wait: cancels its task when its deadline passes, and turns that cancellation into TimeoutError."""

    __slots__ = ("_cancelling", "_deadlines", "_task", "deadline", "expired")

    def __init__(self, deadlines: Deadlines) -> None:
        self._deadlines = deadlines
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self.deadline = 0.0
        self.expired = False

    def __enter__(self) -> TaskTimeout:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a timeout needs a task to cancel")
        self._task = task
        self._cancelling = task.cancelling()
        self.deadline = self._deadlines._start(self)
        return self

    def expire(self) -> None:
        self.expired = True
        assert self._task is not None
        self._task.cancel()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._deadlines._end(self)
        if not self.expired:
            return
        assert self._task is not None
        # The same test asyncio.timeout makes: the cancellation is the deadline's only when no other
        # cancellation of the task is outstanding.
        if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError(f"not done within {self._deadlines.seconds:g} s") from exc


# --- The one reply builder: every answer of the proxy is a ``Reply`` (status, headers as granian's RSGI takes
# them, whole body), made here; typed errors become their status and typed body here.

Headers = list[tuple[str, str]]
_SCOPE, _ENTRIES, _VERSION = api.SCOPE_HEADER, api.ENTRIES_HEADER, api.VERSION_HEADER


@dataclass(slots=True)  # not frozen: one is built per request (see sessionmem_proxy.store.AppendResult)
class Reply:
    status: int
    headers: Headers
    body: bytes


def array_body(head: bytes, items: list[bytes], tail: bytes) -> bytes:
    """``head``, ``items`` separated by commas, then ``tail``, copied once: a JSON document around an array
    of stored values (entries, matches), which make up most of a big answer. Joining the items first and
    the document around them after copies the items twice, and the second buffer of a big answer is fresh
    memory, whose pages cost more than the copy (docs/benchmarks.md)."""
    if not items:
        return head + tail
    parts = [b","] * (2 * len(items) + 1)
    parts[0], parts[-1] = head, tail
    parts[1::2] = items
    return b"".join(parts)


def memory_headers(scope: str, entries: int, version: int | None) -> Headers:
    headers = [*JSON_HEADERS, (_SCOPE, scope), (_ENTRIES, str(entries))]
    if version is not None:
        headers.append((_VERSION, str(version)))
    return headers


def json_reply(body: bytes, status: int = 200) -> Reply:
    return Reply(status, JSON_HEADERS, body)


def model_reply(model: BaseModel) -> Reply:
    return Reply(200, JSON_HEADERS, model.model_dump_json(by_alias=True).encode())


def memory_reply(
    body: bytes | BaseModel, scope: str, entries: int, version: int | None, etag: str | None = None
) -> Reply:
    """A memory operation's answer: its body plus the headers that repeat scope, entries and version, and
    its entity tag when it has one (``sessionmem_core.api.etag``)."""
    raw = body if isinstance(body, bytes) else body.model_dump_json(by_alias=True).encode()
    headers = memory_headers(scope, entries, version)
    if etag is not None:
        headers.append((api.ETAG_HEADER, etag))
    return Reply(200, headers, raw)


def not_modified_reply(etag: str, scope: str, version: int) -> Reply:
    """A conditional read's answer while the caller's ETag is current: 304, the ETag, no body (nor a
    content type: there is no representation, RFC 9110 15.4.5)."""
    return Reply(api.NOT_MODIFIED, [(api.ETAG_HEADER, etag), (_SCOPE, scope), (_VERSION, str(version))], b"")


def text_reply(body: bytes, content_type: str) -> Reply:
    return Reply(200, [("content-type", content_type)], body)


def error_reply(error: SessionMemError, extra: Headers | None = None) -> Reply:
    return Reply(error.status, [*JSON_HEADERS, *error.headers(), *(extra or ())], error.body())


def internal_error_reply(exc: BaseException) -> Reply:
    # Still a typed body: a client must never have to parse a bare text error.
    return Reply(500, JSON_HEADERS, error_body("internal", f"internal error ({type(exc).__name__})"))


# --- The token bucket the proxy counts every rate with: an agent's requests and transfer
# (``sessionmem_proxy.admission.Quotas``), the API calls for unknown tokens (``tokenreview``) and for
# administrators (``admin``).


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``per_second`` on average, ``burst`` at once."""

    per_second: float
    burst: int


@dataclass(slots=True)
class TokenBucket:
    """``tokens`` as of ``at`` (a monotonic clock's seconds); it refills at a rate up to a burst, which
    the caller passes on each look (an agent's limits may change between two). A charge may put it in
    debt (negative tokens)."""

    tokens: float
    at: float

    def refill(self, now: float, rate: float, burst: float) -> float:
        """The tokens at ``now``: what came back since the last look, up to ``burst``."""
        self.tokens = min(burst, self.tokens + (now - self.at) * rate)
        self.at = now
        return self.tokens

    def take(self, now: float, rate: float, burst: float) -> float:
        """Takes one token and answers 0, or takes nothing and answers the seconds until one is back."""
        if self.refill(now, rate, burst) < 1.0:
            return (1.0 - self.tokens) / rate
        self.tokens -= 1.0
        return 0.0
