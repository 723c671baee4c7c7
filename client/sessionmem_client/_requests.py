"""What the sync and async clients share: building each request and decoding each answer.

The two clients differ only in how they send a :class:`Request`, so every rule (id validation before the
network, percent-encoding, headers, typed errors) lives here once.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Generic, Literal, Required, TypedDict, TypeVar, cast

import orjson
from pydantic import BaseModel, ValidationError

from sessionmem_core import api, env, wire
from sessionmem_core.env import ConfigError
from sessionmem_core.errors import BackendUnavailable, InvalidRequest, SessionMemError, from_wire
from sessionmem_core.keys import new_message_id, validate_conversation_id
from sessionmem_infra.http_client import IDEMPOTENT_METHODS

M = TypeVar("M", bound=BaseModel)

#: What ``append`` and ``replace`` accept for one entry: the wire model, a stored entry (as returned by a
#: read or an export, for re-seeding) or a plain mapping ``{"role": ..., "content": ..., "id"?: ...}``.
EntryLike = wire.EntryIn | wire.Entry | Mapping[str, Any]

DEFAULT_TIMEOUT_SECONDS = 5.0
CONFIRM_PARAM = "confirm"
CURSOR_PARAM = "cursor"
QUERY_PARAM = "q"
SUMMARY_PARAM = "summary"
IF_MATCH_HEADER = "if-match"
IDEMPOTENCY_KEY_HEADER = "idempotency-key"
JSON_CONTENT_TYPE = "application/json"
# The most matches one search answers (the contract's bound on its ``limit``).
MAX_SEARCH_LIMIT: int = next(
    p.schema["maximum"] for p in api.MEMORY_OPERATION["search"].params if p.name == api.LIMIT_PARAM
)


def default_base_url(environ: Mapping[str, str] | None = None) -> str:
    """``http://127.0.0.1:<port>``: the launcher's memory endpoint inside the pod; the port is
    ``SESSIONMEM_LAUNCHER_PORT`` when set, else 2998."""
    environ = os.environ if environ is None else environ
    raw = (environ.get(env.LAUNCHER_PORT) or "").strip()
    if not raw:
        return f"http://127.0.0.1:{env.DEFAULT_LAUNCHER_PORT}"
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError(f"{env.LAUNCHER_PORT}={raw!r} is not a TCP port")
    return f"http://127.0.0.1:{int(raw)}"


def _segment(conversation_id: str) -> str:
    """The id, validated by the contract's rule before anything is sent. The path builders in
    ``sessionmem_core.wire`` percent-encode it (a valid id may hold ``?``, ``#`` or ``%``)."""
    return validate_conversation_id(conversation_id)


def new_entry(role: wire.Role, content: str, entry_id: str | None = None) -> wire.EntryIn:
    """An entry checked by the contract's model; one it refuses (content too long, ...) is
    :class:`~sessionmem_core.errors.InvalidRequest`, as the server's answer to it would be."""
    try:
        return wire.EntryIn(role=role, content=content, id=entry_id)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid entry: {_problems(exc)}") from exc


def to_entries(entries: Iterable[EntryLike]) -> list[wire.EntryIn]:
    """Entries as wire models, checked here (role, content size, message id) before anything is sent."""
    if isinstance(entries, (str, bytes, Mapping, BaseModel)):
        raise InvalidRequest("entries must be a sequence of entries, not a single entry")
    result: list[wire.EntryIn] = []
    for entry in entries:
        if isinstance(entry, wire.EntryIn):
            result.append(entry)
        elif isinstance(entry, wire.Entry):
            # Its item too: an entry read back and written again (a replace, a re-seed) stays lossless.
            result.append(wire.EntryIn(role=entry.role, content=entry.content, id=entry.id, item=entry.item))
        elif isinstance(entry, Mapping):
            try:
                result.append(wire.EntryIn.model_validate(dict(entry)))
            except ValidationError as exc:
                raise InvalidRequest(f"invalid entry: {_problems(exc)}") from exc
        else:
            raise InvalidRequest(f"an entry is an EntryIn or a mapping, not {type(entry).__name__}")
    return result


def exchange_entries(user: str, assistant: str, turn_id: str | None) -> list[wire.EntryIn]:
    """The {user, assistant} pair with ids ``<turn>-u`` / ``<turn>-a``: a retried exchange is stored once."""
    turn = new_message_id() if turn_id is None else turn_id
    return [
        wire.EntryIn(role=wire.Role.USER, content=user, id=f"{turn}-u"),
        wire.EntryIn(role=wire.Role.ASSISTANT, content=assistant, id=f"{turn}-a"),
    ]


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err.get('loc', ())) or 'value'}: {err.get('msg', 'invalid')}"
        for err in exc.errors()[:5]
    )


def _if_match(if_version: int | None) -> str | None:
    if if_version is None:
        return None
    if if_version < 0:
        raise InvalidRequest(f"if_version must be a version number (got {if_version})")
    return str(if_version)


def _body(model: BaseModel) -> bytes:
    return model.model_dump_json(exclude_none=True, by_alias=True).encode()


class EntryFields(TypedDict, total=False):
    """An entry to append in its wire form (the fields of ``wire.EntryIn``), as the framework adapters
    send their batches."""

    role: Required[str]
    content: Required[str]
    id: str
    item: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Request(Generic[M]):
    """One memory API call, ready to send: the answer is decoded into ``model``."""

    method: str
    path: str
    model: type[M]
    params: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    if_match: str | None = None
    traceparent: str | None = None
    # Whether it may be sent again when a pooled connection turns out closed (None: as the method says):
    # an append is when it carries an idempotency key, or every entry carries its id (old rule).
    idempotent: bool | None = None
    idempotency_key: str | None = None
    # A conditional read's validator (the ETag of the answer the client holds), and an append's Prefer.
    if_none_match: str | None = None
    prefer: str | None = None

    @property
    def retry_safe(self) -> bool:
        """Whether sending it twice has the effect of sending it once."""
        return self.method in IDEMPOTENT_METHODS if self.idempotent is None else self.idempotent


class Requests:
    """Builds every request of the memory API. Everything that can be checked without the network is
    checked here, so a bad conversation id raises before a connection is even attempted."""

    @staticmethod
    def read(conversation_id: str, limit: int, summary: bool, traceparent: str | None) -> Request[wire.History]:
        path = api.entries_path(_segment(conversation_id))
        if not 0 <= limit <= env.MAX_READ_LIMIT:
            raise InvalidRequest(f"limit must be between 0 and {env.MAX_READ_LIMIT} (got {limit})")
        params = [(api.LIMIT_PARAM, str(limit))]
        if summary:
            params.append((SUMMARY_PARAM, "true"))
        return Request("GET", path, wire.History, tuple(params), traceparent=traceparent)

    @staticmethod
    def append(
        conversation_id: str, entries: Iterable[EntryLike], traceparent: str | None, if_version: int | None = None
    ) -> Request[wire.AppendResponse]:
        path = api.entries_path(_segment(conversation_id))
        if_match = _if_match(if_version)
        try:
            body = wire.AppendRequest(entries=to_entries(entries))
        except ValidationError as exc:
            raise InvalidRequest(f"invalid append: {_problems(exc)}") from exc
        # Sent again on a dropped connection only when a second one stores nothing: its entries are
        # identified, or it is conditional (a second one finds the version moved on).
        identified = if_match is not None or all(entry.id for entry in body.entries)
        return Request(
            "POST",
            path,
            wire.AppendResponse,
            body=_body(body),
            if_match=if_match,
            traceparent=traceparent,
            idempotent=identified,
        )

    @staticmethod
    def append_batch(
        conversation_id: str,
        entries: list[EntryFields],
        idempotency_key: str | None = None,
        if_version: int | None = None,
        prefer: str | None = None,
    ) -> Request[wire.AppendResponse]:
        """:meth:`append` for the framework adapters, whose turn it is on: their entries are checked by the
        server, not here (the adapters make the role and the text themselves; the size limits are the
        server's to enforce), so a refused entry comes back as the server's typed error and nothing of its
        batch is stored. Made in place, ``EntryIn`` models and the request model around them cost a share
        of a sequential agent's turn many times what they cost in a loop (docs/benchmarks.md)."""
        path = api.entries_path(_segment(conversation_id))
        if_match = _if_match(if_version)
        identified = idempotency_key is not None or if_match is not None or all(entry.get("id") for entry in entries)
        return Request(
            "POST",
            path,
            wire.AppendResponse,
            body=orjson.dumps({"entries": entries}),
            if_match=if_match,
            idempotent=identified,
            idempotency_key=idempotency_key,
            prefer=prefer,
        )

    @staticmethod
    def replace(
        conversation_id: str, entries: Iterable[EntryLike], if_version: int | None, traceparent: str | None
    ) -> Request[wire.ReplaceResponse]:
        path = api.conversation_path(_segment(conversation_id))
        if if_version is not None and if_version < 0:
            raise InvalidRequest(f"if_version must be a version number (got {if_version})")
        try:
            body = wire.ReplaceRequest(entries=to_entries(entries))
        except ValidationError as exc:
            raise InvalidRequest(f"invalid replace: {_problems(exc)}") from exc
        if_match = None if if_version is None else str(if_version)
        return Request("PUT", path, wire.ReplaceResponse, body=_body(body), if_match=if_match, traceparent=traceparent)

    @staticmethod
    def delete(
        conversation_id: str, traceparent: str | None, if_version: int | None = None
    ) -> Request[wire.DeleteResponse]:
        path = api.conversation_path(_segment(conversation_id))
        return Request("DELETE", path, wire.DeleteResponse, if_match=_if_match(if_version), traceparent=traceparent)

    @staticmethod
    def pop(conversation_id: str, if_version: int | None, traceparent: str | None) -> Request[wire.PopResponse]:
        path = api.conversation_path(_segment(conversation_id)) + "/pop"
        # Not repeated on a dropped connection without If-Match: a second pop would remove a second entry.
        return Request(
            "POST",
            path,
            wire.PopResponse,
            if_match=_if_match(if_version),
            traceparent=traceparent,
            idempotent=if_version is not None,
        )

    @staticmethod
    def rewind(
        conversation_id: str, to_version: int, if_version: int | None, traceparent: str | None
    ) -> Request[wire.RewindResponse]:
        path = api.conversation_path(_segment(conversation_id)) + "/rewind"
        try:
            body = wire.RewindRequest(toVersion=to_version)
        except ValidationError as exc:
            raise InvalidRequest(f"invalid rewind: {_problems(exc)}") from exc
        # Dropping what came after a version twice drops nothing more.
        return Request(
            "POST",
            path,
            wire.RewindResponse,
            body=_body(body),
            if_match=_if_match(if_version),
            traceparent=traceparent,
            idempotent=True,
        )

    @staticmethod
    def fork(
        conversation_id: str, new_conversation_id: str, at_version: int | None, traceparent: str | None
    ) -> Request[wire.ForkResponse]:
        path = api.conversation_path(_segment(conversation_id)) + "/fork"
        try:
            body = wire.ForkRequest(conversationId=validate_conversation_id(new_conversation_id), atVersion=at_version)
        except ValidationError as exc:
            raise InvalidRequest(f"invalid fork: {_problems(exc)}") from exc
        return Request("POST", path, wire.ForkResponse, body=_body(body), traceparent=traceparent)

    @staticmethod
    def compact(
        conversation_id: str, summary: EntryLike, through_version: int, traceparent: str | None
    ) -> Request[wire.CompactResponse]:
        path = api.conversation_path(_segment(conversation_id)) + "/compact"
        try:
            body = wire.CompactRequest(summary=to_entries([summary])[0], throughVersion=through_version)
        except ValidationError as exc:
            raise InvalidRequest(f"invalid compaction: {_problems(exc)}") from exc
        # Recording the same summary for the same version twice records it once.
        return Request("POST", path, wire.CompactResponse, body=_body(body), traceparent=traceparent, idempotent=True)

    @staticmethod
    def search(conversation_id: str, q: str, limit: int, traceparent: str | None) -> Request[wire.SearchResponse]:
        path = api.search_path(_segment(conversation_id))
        if not q:
            raise InvalidRequest("the search query must not be empty")
        if limit < 1:
            raise InvalidRequest(f"limit must be at least 1 (got {limit})")
        params = ((QUERY_PARAM, q), (api.LIMIT_PARAM, str(limit)))
        return Request("GET", path, wire.SearchResponse, params, traceparent=traceparent)

    @staticmethod
    def info(conversation_id: str, traceparent: str | None) -> Request[wire.ConversationInfo]:
        path = api.conversation_path(_segment(conversation_id))
        return Request("GET", path, wire.ConversationInfo, traceparent=traceparent)

    @staticmethod
    def export(conversation_id: str, traceparent: str | None) -> Request[wire.History]:
        path = api.export_path(_segment(conversation_id))
        return Request("GET", path, wire.History, traceparent=traceparent)

    @staticmethod
    def set_metadata(
        conversation_id: str, title: str | None, labels: Mapping[str, str] | None, traceparent: str | None
    ) -> Request[wire.ConversationRef]:
        path = api.conversation_path(_segment(conversation_id)) + "/metadata"
        try:
            body = wire.MetadataRequest(title=title, labels=dict(labels) if labels is not None else None)
        except ValidationError as exc:
            raise InvalidRequest(f"invalid metadata: {_problems(exc)}") from exc
        # Setting a title and labels again sets the same record: safe to repeat.
        return Request("PATCH", path, wire.ConversationRef, body=_body(body), idempotent=True, traceparent=traceparent)

    @staticmethod
    def list_conversations(limit: int, cursor: str | None, traceparent: str | None) -> Request[wire.ConversationList]:
        if limit < 1:
            raise InvalidRequest(f"limit must be at least 1 (got {limit})")
        params = [(api.LIMIT_PARAM, str(limit))]
        if cursor is not None:
            params.append((CURSOR_PARAM, cursor))
        return Request("GET", api.CONVERSATIONS_PATH, wire.ConversationList, tuple(params), traceparent=traceparent)

    @staticmethod
    def erase_user(traceparent: str | None) -> Request[wire.UserErasure]:
        return Request("DELETE", api.USER_CONVERSATIONS_PATH, wire.UserErasure, traceparent=traceparent)


@cache
def _trace_context() -> tuple[Any, Any] | None:
    try:
        from opentelemetry.trace import get_current_span
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:  # pragma: no cover - opentelemetry-api is optional for the client
        return None
    return get_current_span, TraceContextTextMapPropagator()


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the active OpenTelemetry span, if opentelemetry-api is installed and a
    span is recording; None otherwise."""
    trace_context = _trace_context()
    if trace_context is None:  # pragma: no cover - opentelemetry-api is optional for the client
        return None
    get_current_span, propagator = trace_context
    if not get_current_span().get_span_context().is_valid:  # the common case: no span, nothing to send
        return None
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    return carrier.get(api.TRACEPARENT_HEADER)


@dataclass(frozen=True, slots=True)
class CallOptions:
    """Per-client settings every request carries."""

    base_url: str
    turn: str | None
    traceparent: str | None
    propagate_trace_context: bool

    def url(self, request: Request[Any]) -> str:
        return self.base_url.rstrip("/") + request.path

    def traceparent_of(self, request: Request[Any]) -> str | None:
        """The request's own traceparent, else the client's, else (when propagating) the active span's."""
        traceparent = request.traceparent or self.traceparent
        if traceparent is None and self.propagate_trace_context:
            traceparent = current_traceparent()
        return traceparent or None

    def headers(self, request: Request[Any]) -> dict[str, str]:
        headers = self.header_fields(request.body is not None, request.if_match, self.traceparent_of(request))
        if request.idempotency_key is not None:
            headers[IDEMPOTENCY_KEY_HEADER] = request.idempotency_key
        if request.if_none_match is not None:
            headers[api.IF_NONE_MATCH_HEADER] = request.if_none_match
        if request.prefer is not None:
            headers[api.PREFER_HEADER] = request.prefer
        return headers

    def header_fields(self, has_body: bool, if_match: str | None, traceparent: str | None) -> dict[str, str]:
        headers = {"accept": JSON_CONTENT_TYPE}
        if has_body:
            headers["content-type"] = JSON_CONTENT_TYPE
        if self.turn is not None:
            headers[api.TURN_HEADER] = self.turn
        if if_match is not None:
            headers[IF_MATCH_HEADER] = if_match
        if traceparent is not None:
            headers[api.TRACEPARENT_HEADER] = traceparent
        return headers


def unreachable(options: CallOptions, request: Request[Any], exc: Exception) -> BackendUnavailable:
    return BackendUnavailable(
        f"memory endpoint {options.base_url} unreachable ({request.method} {request.path}): {type(exc).__name__}"
    )


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer as the transports hand it over: status and body are all the contract needs, and
    ``Retry-After`` when the server asked the caller to come back later."""

    status: int
    body: bytes
    retry_after: str | None = None
    etag: str | None = None


DEFAULT_RETRIES = 4
# The longest single wait between attempts, whatever Retry-After says: a client bounds its own latency.
MAX_RETRY_WAIT_SECONDS = 10.0
_FIRST_BACKOFF_SECONDS = 0.1
_RETRIED_STATUSES = frozenset({429, 503})
_NOT_PROCESSED = b'"overloaded"'  # a 503 of a worker that refused the request before doing anything


def retry_delay(request: Request[Any], reply: Reply, retries_done: int, retries: int) -> float | None:
    """Seconds to wait before sending ``request`` again, or None to answer with ``reply``.

    A 429 (rate limited: nothing was done) is retried; a 503 is retried when the request may be sent twice
    (an idempotent method, an append with an idempotency key or identified entries) or when the server
    says it refused the request unprocessed. The wait is the answer's ``Retry-After`` (seconds), else a
    doubling backoff, capped at ``MAX_RETRY_WAIT_SECONDS``; after ``retries`` retries the answer stands
    (the caller raises its typed error: ``RateLimited``, ``Overloaded``, ``BackendUnavailable``)."""
    status = reply.status
    if status not in _RETRIED_STATUSES or retries_done >= retries:
        return None
    if status == 503 and not request.retry_safe and _NOT_PROCESSED not in reply.body:
        return None
    wait: float = _FIRST_BACKOFF_SECONDS * (2**retries_done)
    retry_after = reply.retry_after
    if retry_after is not None and retry_after.strip().isdigit():  # an HTTP date: the backoff instead
        wait = float(retry_after.strip())
    return min(wait, MAX_RETRY_WAIT_SECONDS)


def decode(request: Request[M], reply: Reply) -> M:
    """The typed model of a 2xx answer; a typed :class:`SessionMemError` (rebuilt with ``from_wire``)
    for anything else."""
    if reply.status >= 400:
        raise from_wire(reply.status, reply.body)
    try:
        return request.model.model_validate_json(reply.body)
    except ValidationError as exc:
        error = SessionMemError(
            f"unexpected answer to {request.method} {request.path} (HTTP {reply.status}): {_problems(exc)}"
        )
        error.status = reply.status
        raise error from exc


def check_stored(request: Request[Any], reply: Reply) -> None:
    """A 2xx answer, of which the caller needs nothing more; a typed :class:`SessionMemError` otherwise.
    (Building the answer's model cost the adapters, which drop it, a share of their turn.)"""
    if reply.status >= 400:
        raise from_wire(reply.status, reply.body)
    if not 200 <= reply.status < 300:
        error = SessionMemError(f"unexpected answer to {request.method} {request.path} (HTTP {reply.status})")
        error.status = reply.status
        raise error


@lru_cache(maxsize=1024)
def window_read(conversation_id: str, limit: int, summary: bool) -> Request[wire.History]:
    """:meth:`Requests.read` of an adapter's window, kept (a request is immutable): an adapter reads the
    same window of the same conversation every turn, and building it again cost a share of the turn
    (docs/benchmarks.md). A request the contract refuses raises every time; errors are not cached."""
    return Requests.read(conversation_id, limit, summary, None)


@lru_cache(maxsize=1024)
def export_read(conversation_id: str) -> Request[wire.History]:
    """:meth:`Requests.export` of an adapter's conversation, kept as :func:`window_read` is."""
    return Requests.export(conversation_id, None)


def decode_entries(request: Request[wire.History], reply: Reply) -> list[dict[str, Any]]:
    """A read's or an export's entries as the JSON objects the answer holds (the summary first, when
    there is one), for the framework adapters, which take each entry's ``item`` (or role and text) at once:
    building the History model first cost more than the rest of their turn. Each must be an object with
    a string role and content; anything else is an unexpected answer."""
    if reply.status >= 400:
        raise from_wire(reply.status, reply.body)
    try:
        data = orjson.loads(reply.body)
        summary = data.get("summary")
        entries = data["entries"] if summary is None else [summary, *data["entries"]]
        for entry in entries:
            if type(entry["role"]) is not str or type(entry["content"]) is not str:
                raise TypeError(f"entry {entry.get('id')!r} lacks a string role and content")
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
        error = SessionMemError(
            f"unexpected answer to {request.method} {request.path} (HTTP {reply.status}): {type(exc).__name__} {exc}"
        )
        error.status = reply.status
        raise error from exc
    return cast(list[dict[str, Any]], entries)


class WindowEntry(TypedDict):
    """What the framework adapters keep of a stored entry, as the answer carries it."""

    id: str
    role: Literal["user", "assistant", "system"]
    content: str


_ROLE_VALUES = frozenset(role.value for role in wire.Role)


def decode_window(request: Request[wire.History], reply: Reply) -> list[WindowEntry]:
    """A read's entries (the summary first, when the answer has one) as the JSON objects the answer holds,
    for the framework adapters: they turn each entry into their own message type at once, and building
    the History model first cost more than the rest of their turn. The fields they
    use are still checked: an entry without a known role or a string id and content is an unexpected
    answer."""
    if reply.status >= 400:
        raise from_wire(reply.status, reply.body)
    try:
        data = orjson.loads(reply.body)
        summary = data.get("summary")
        entries = data["entries"] if summary is None else [summary, *data["entries"]]
        for entry in entries:
            if entry["role"] not in _ROLE_VALUES or type(entry["content"]) is not str or type(entry["id"]) is not str:
                raise TypeError(f"entry {entry.get('id')!r} lacks a known role, or a string id and content")
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
        error = SessionMemError(
            f"unexpected answer to {request.method} {request.path} (HTTP {reply.status}): {type(exc).__name__} {exc}"
        )
        error.status = reply.status
        raise error from exc
    return cast(list[WindowEntry], entries)


# --- Conditional reads: what a client keeps of the reads its adapters make.

DEFAULT_READ_CACHE_BYTES = 8 * 1024 * 1024
# A read is kept only while its answer is well inside the bytes a read may answer (``READ_ANSWER_BYTES``
# of the proxy, 4 MiB stored), so a window the client extends with its own append is the window the proxy
# would answer (the proxy cuts a larger one at its bytes, stored: sealed entries take more).
MAX_KEPT_ANSWER_BYTES = 1024 * 1024
MAX_KEPT_READS = 256

# (conversation id, limit or None for all of it, the turn handle it was read under)
ReadKey = tuple[str, int | None, str | None]


Convert = Callable[[list[dict[str, Any]]], list[Any]]


@dataclass(slots=True)
class KeptRead:
    """An answer the client holds: its ETag, its entries (the client's own copy), its size in bytes, and
    what an adapter made of the entries (``convert``: one object per entry, in order) if one did."""

    etag: str
    entries: list[dict[str, Any]]
    size: int
    converted: list[Any] | None = None
    convert: Convert | None = None

    def converted_by(self, convert: Convert) -> list[Any]:
        """``convert`` of the entries (kept for the next hit): a new list of the kept objects, which are
        never changed here and never to be changed by whoever gets them (see ``json_copy``)."""
        if self.convert is not convert or self.converted is None:
            self.converted, self.convert = convert(self.entries), convert
        return list(self.converted)


class ReadCache:
    """The last answer of each read the framework adapters make (a conversation, a window or all of it, the
    turn it was made for), to send its ETag back (If-None-Match) and take a 304 for it; bounded in answers
    and bytes (least recently used first out), per client (a client and its ``with_turn`` clones share it,
    keyed by the turn: one end user's answers are never another's).

    After an append of the client's own that answered its entries (``Prefer: return=representation``),
    the kept reads of that conversation move to the state right after it, but only when the append's ETag
    is the one right after theirs (same life, next version): no other write came between. Anything else
    drops them; the server's ETag decides every time whether what is kept is current, so a kept read is
    never answered for a state it is not. Safe between threads (the sync client is)."""

    __slots__ = ("_bytes", "_kept", "_lock", "max_bytes")

    def __init__(self, max_bytes: int = DEFAULT_READ_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._kept: OrderedDict[ReadKey, KeptRead] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: ReadKey) -> KeptRead | None:
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
            return kept

    def holds(self, conversation_id: str, turn: str | None) -> bool:
        """Whether a read of this conversation (for this turn) is kept: an append then asks for its entries."""
        with self._lock:
            return any(key[0] == conversation_id and key[2] == turn for key in self._kept)

    def put(self, key: ReadKey, etag: str, entries: list[dict[str, Any]], size: int) -> KeptRead | None:
        """Keep ``entries`` (the caller's no longer: they are the cache's now, as ``stored`` is for
        ``appended``) as the answer tagged ``etag``; what is kept, or None when it is too large to keep."""
        with self._lock:
            self._drop(key)
            if size > MAX_KEPT_ANSWER_BYTES or size > self.max_bytes:
                return None
            kept = self._kept[key] = KeptRead(etag, entries, size)
            self._bytes += size
            while self._bytes > self.max_bytes or len(self._kept) > MAX_KEPT_READS:
                self._drop(next(iter(self._kept)))
            return kept

    def appended(
        self,
        conversation_id: str,
        turn: str | None,
        etag: str | None,
        stored: list[dict[str, Any]],
        size: int,
        length: int,
    ) -> None:
        """Move the kept reads of a conversation on past the client's own append (``stored``: its entries as
        the server answered them, ``size`` their bytes, ``etag`` the state right after it, ``length`` the
        entries the conversation holds after it) when the append came right after their state; drop them
        otherwise. What an adapter made of them is extended with its ``convert`` of the new entries."""
        after = None if etag is None else api.etag_parts(etag)
        with self._lock:
            for key in [key for key in self._kept if key[0] == conversation_id and key[2] == turn]:
                kept = self._kept[key]
                before = api.etag_parts(kept.etag)
                follows = (
                    after is not None
                    and before is not None
                    and before[2] is None  # an answer with a compaction summary is not extended (its summary leads)
                    and (before[0], before[1] + 1) == (after[0], after[1])
                )
                if not follows:
                    self._drop(key)
                    continue
                limit = key[1]
                entries = [*kept.entries, *stored]
                wanted = length if limit is None else min(limit, length)
                if len(entries) < wanted or kept.size + size > MAX_KEPT_ANSWER_BYTES:
                    self._drop(key)
                    continue
                # Bytes in proportion to the entries kept (those the window or the cap let go are gone).
                new_size = (kept.size + size) * wanted // max(1, len(entries))
                del entries[: len(entries) - wanted]
                converted = None
                if kept.converted is not None and kept.convert is not None:
                    converted = [*kept.converted, *kept.convert(stored)]
                    del converted[: len(converted) - wanted]
                assert etag is not None
                self._kept[key] = KeptRead(etag, entries, new_size, converted, kept.convert)
                self._bytes += new_size - kept.size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._kept)))

    def _drop(self, key: ReadKey) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self._bytes -= kept.size

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0


def json_copy(value: list[Any]) -> list[Any]:
    """A deep copy of JSON values (what a read's entries and items are), made by orjson: a fraction of
    ``copy.deepcopy``'s cost, so a kept read is handed out as the caller's own objects."""
    return cast(list[Any], orjson.loads(orjson.dumps(value)))


def appended_entries(request: Request[Any], reply: Reply) -> tuple[list[dict[str, Any]], int] | None:
    """(the stored entries, the conversation's length) of an append that answered its representation;
    None when it did not (a retry, duplicates, a server that does not)."""
    if reply.etag is None or b'"entries":' not in reply.body:
        return None
    try:
        data = orjson.loads(reply.body)
        entries, length = data["entries"], data["length"]
        if not isinstance(entries, list) or type(length) is not int:
            return None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return cast(list[dict[str, Any]], entries), length
