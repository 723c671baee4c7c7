"""The one way the launcher reaches memory: the ``Forwarder``'s named operations (``read``, ``append``,
``replace``, ``search``, ``info``, ``delete``, ``export``, and the agent-wide ``list``, ``clear`` and
``erase_user``), or ``forward`` naming one of them.

Every memory operation goes through it: the agent's own calls on the memory endpoint, the managed loop's
replay and append, the compactor's export and replace. It takes the conversation as a parsed
``ConversationId`` (each process parses the id it receives once), sets the pod's identity (its projected
ServiceAccount token) and the pod's parameters (scope, cap, TTL, redactors) whatever the caller sent,
relays only the allow-listed caller headers, records one ``memory.<op>`` span, and has one error path: a
typed error becomes its typed answer, and an error answer of the proxy passes through as it is and fails
the span. A call refused before it could be forwarded (its id, its body, its turn) is answered by
``refused``, which records its failed span the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import orjson

from sessionmem_core import api
from sessionmem_core.env import PROXY_URL, ConfigError, LauncherSettings
from sessionmem_core.errors import BackendUnavailable, InvalidRequest, SessionMemError, UserCapabilityRequired
from sessionmem_core.keys import ConversationId
from sessionmem_infra.backend_state import BackendState, cause_of
from sessionmem_infra.http_client import HttpClient, HttpResponse
from sessionmem_infra.telemetry import MemoryTracer, inject_traceparent

# Query parameters set from the pod's configuration on every call; an agent's values for them are dropped.
POD_PARAMS = frozenset({api.SCOPE_PARAM, api.CAP_PARAM, api.TTL_PARAM, api.REDACT_PARAM})
# Operations that store, and so carry the write parameters (cap, TTL, redactors) besides the scope; and
# those that take a body.
_WRITES = frozenset(operation.op for operation in api.MEMORY_OPERATIONS if operation.writes)
_BODIED = frozenset(operation.op for operation in api.MEMORY_OPERATIONS if operation.request is not None)
_SCOPE = api.SCOPE_HEADER.encode()
_LOG = logging.getLogger("sessionmem.launcher")
_IF_MATCH = api.IF_MATCH_HEADER.encode()
_IDEMPOTENCY_KEY = api.IDEMPOTENCY_KEY_HEADER.encode()
_IF_NONE_MATCH = api.IF_NONE_MATCH_HEADER.encode()
_PREFER = api.PREFER_HEADER.encode()
_ETAG = api.ETAG_HEADER.encode()
_RETRY_AFTER = "retry-after"
# How often a pod's first readiness answer tries the proxy while it waits for it to answer.
_REACH_RETRY_SECONDS = 0.1
# How often an export starts over when the conversation changed between its pages.
_EXPORT_ATTEMPTS = 3
# How a JSON document whose last member is ``"nextOffset": null`` ends (written compactly, as the proxy
# writes its pages): nothing else can end a document with these bytes, since the final brace closes the
# outermost object. A page that ends otherwise (a summary after it, another layout) is decoded.
_LAST_PAGE_END = b'"nextOffset":null}'


@dataclass(frozen=True, slots=True)
class CallerHeaders:
    """The only request headers of a caller that reach the proxy (an allow-list: an identity header the
    agent sets never does; the identity is the pod's token). ``capability`` is the end user's, as the
    launcher holds it: never read from an agent's request (``sessionmem_launcher.turns``)."""

    capability: str | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    if_match: str | None = None
    idempotency_key: str | None = None
    if_none_match: str | None = None
    prefer: str | None = None

    @classmethod
    def of(cls, get: _HeaderGetter, capability: str | None) -> CallerHeaders:
        return cls(
            capability=capability,
            traceparent=get(api.TRACEPARENT_HEADER),
            tracestate=get("tracestate"),
            if_match=get(api.IF_MATCH_HEADER),
            idempotency_key=get(api.IDEMPOTENCY_KEY_HEADER),
            if_none_match=get(api.IF_NONE_MATCH_HEADER),
            prefer=get(api.PREFER_HEADER),
        )


class _HeaderGetter(Protocol):
    def __call__(self, name: str, /) -> str | None: ...


@dataclass(frozen=True, slots=True)
class MemoryReply:
    status: int
    body: bytes
    scope: str | None = None
    entries: int | None = None
    version: int | None = None
    # What the answer tells the agent besides its body: when to retry a 429 or a 503 (Retry-After), and the
    # entity tag of what it answers (a read's, an export's, an append's that answered its entries).
    retry_after: str | None = None
    etag: str | None = None


def _refusal(error: SessionMemError) -> MemoryReply:
    retry_after = next((value for name, value in error.headers() if name == _RETRY_AFTER), None)
    return MemoryReply(error.status, error.body(), retry_after=retry_after)


class Transport(Protocol):
    """Sends one request, bounded by the launcher's proxy timeout (an OSError when it runs out)."""

    async def request(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[bytes, bytes]] = (),
        body: bytes | None = None,
        idempotent: bool | None = None,
    ) -> HttpResponse: ...

    async def aclose(self) -> None: ...


class _TokenFile:
    """The pod's projected token as an ``Authorization`` value, read again only when ``stat`` of the path
    tells it changed (reading the file on every call cost more than the rest of the header building).

    The kubelet rotates a projected token by pointing a symlink at a new directory, which ``os.stat``
    (following links) sees as another inode; an in-place rewrite changes mtime, ctime or size. The path is
    stat'ed before it is read, so a change landing between the two is seen again on the next call."""

    __slots__ = ("_path", "_seen", "_value")

    def __init__(self, path: Path) -> None:
        self._path = path
        self._seen: tuple[int, int, int, int, int] | None = None
        self._value = b""

    def authorization(self) -> bytes:
        try:
            st = os.stat(self._path)
            seen = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if seen != self._seen:
                self._value = b"Bearer " + self._path.read_text().strip().encode()
                self._seen = seen
        except (OSError, UnicodeError) as exc:
            # Checked on every call: a token gone or unreadable is never masked by the cached copy.
            self._seen = None
            raise BackendUnavailable(f"pod token {self._path} is not readable") from exc
        return self._value


class Forwarder:
    def __init__(self, settings: LauncherSettings, transport: Transport, tracer: MemoryTracer) -> None:
        self._settings = settings
        self._http = transport
        self.tracer = tracer
        self._token = _TokenFile(Path(settings.token_path))
        # Memory's state as this pod sees it (the proxy, and the backend behind it), logged when it changes.
        self.memory = BackendState(_LOG, "memory (the proxy)", settings.proxy_url or "")
        # The pod's own parameters never change: encoded once, not on every call.
        write = [
            (api.SCOPE_PARAM, settings.scope),
            (api.CAP_PARAM, str(settings.cap)),
            (api.TTL_PARAM, str(settings.ttl_seconds)),
        ]
        if settings.redact:
            write.append((api.REDACT_PARAM, ",".join(settings.redact)))
        self._write_query = api.query_string(write)
        self._read_query = api.query_string([(api.SCOPE_PARAM, settings.scope)])

    # --- the named operations ---

    async def read(
        self, conversation: ConversationId, caller: CallerHeaders, query: Sequence[tuple[str, str]] = ()
    ) -> MemoryReply:
        """The newest entries (``limit``, ``summary`` in ``query``)."""
        return await self.forward("get", conversation, caller, query)

    async def append(
        self,
        conversation: ConversationId,
        body: bytes,
        caller: CallerHeaders,
        query: Sequence[tuple[str, str]] = (),
        *,
        identified: bool = False,
    ) -> MemoryReply:
        """``identified``: every entry carries its message id, so the store keeps a repeated append once and
        it may be sent again when a pooled connection turns out closed (otherwise a POST never is)."""
        return await self.forward("append", conversation, caller, query, body, idempotent=identified or None)

    async def replace(
        self, conversation: ConversationId, body: bytes, caller: CallerHeaders, query: Sequence[tuple[str, str]] = ()
    ) -> MemoryReply:
        """Replace the history, conditional on ``caller.if_match``."""
        return await self.forward("replace", conversation, caller, query, body)

    async def export(
        self, conversation: ConversationId, caller: CallerHeaders, query: Sequence[tuple[str, str]] = ()
    ) -> MemoryReply:
        """The whole conversation as one ``History``, read from the proxy a page at a time."""
        return await self.forward("export", conversation, caller, query)

    async def search(
        self, conversation: ConversationId, caller: CallerHeaders, query: Sequence[tuple[str, str]] = ()
    ) -> MemoryReply:
        return await self.forward("search", conversation, caller, query)

    async def info(
        self, conversation: ConversationId, caller: CallerHeaders, query: Sequence[tuple[str, str]] = ()
    ) -> MemoryReply:
        return await self.forward("info", conversation, caller, query)

    async def delete(
        self, conversation: ConversationId, caller: CallerHeaders, query: Sequence[tuple[str, str]] = ()
    ) -> MemoryReply:
        return await self.forward("delete", conversation, caller, query)

    async def list(self, caller: CallerHeaders, query: Sequence[tuple[str, str]] = ()) -> MemoryReply:
        return await self.forward("list", None, caller, query)

    async def clear(self, caller: CallerHeaders, query: Sequence[tuple[str, str]] = ()) -> MemoryReply:
        return await self.forward("clear", None, caller, query)

    async def erase_user(self, caller: CallerHeaders, query: Sequence[tuple[str, str]] = ()) -> MemoryReply:
        return await self.forward("erase_user", None, caller, query)

    # --- one operation, named ---

    async def forward(
        self,
        op: str,
        conversation: ConversationId | None,
        caller: CallerHeaders,
        query: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        idempotent: bool | None = None,
    ) -> MemoryReply:
        """Forward one memory operation (``op`` as ``api.memory_route`` names it; ``conversation`` None for
        the agent-wide ones) and answer with the proxy's status and body, or the typed answer of what
        stopped it. ``idempotent``: as ``HttpClient.request`` takes it (None: as the method says)."""
        method, target = api.memory_target(op, conversation)
        try:
            with self.tracer.span(op, conversation or "", caller.traceparent, caller.tracestate) as span:
                span.scope = self._settings.scope  # what is asked for, until the proxy says what it used
                if op in _BODIED and not body:
                    raise InvalidRequest("request body is required")
                if self._settings.per_user and caller.capability is None:
                    # Without the user's capability this agent's memory would mix users: refuse, never fall back.
                    raise UserCapabilityRequired(
                        "this agent keeps memory per user: a memory call needs the live turn handle the launcher "
                        f"sent with the request ({api.TURN_HEADER}), and that request the caller's "
                        f"{api.USER_CAPABILITY_HEADER}"
                    )
                if op == "export":
                    reply = await self._export(target, query, caller)
                else:
                    reply = await self._send(method, op, target, query, body or None, caller, idempotent)
                span.scope = reply.scope or span.scope
                span.entries, span.version = reply.entries, reply.version
                if reply.status >= 400:
                    span.fail(_error_type(reply.body))
                return reply
        except SessionMemError as exc:
            return _refusal(exc)

    def refused(self, op: str, conversation_id: str, caller: CallerHeaders, error: SessionMemError) -> MemoryReply:
        """The typed answer of an operation refused before it could be forwarded (a bad id, a body over the
        limit, a turn handle that is not live), recorded as its failed ``memory.<op>`` span, with the scope
        the launcher asks for (``memory.scope``, as on every span)."""
        try:
            with self.tracer.span(op, conversation_id, caller.traceparent, caller.tracestate) as span:
                span.scope = self._settings.scope
                raise error
        except SessionMemError as exc:
            return _refusal(exc)

    async def _export(self, path: str, query: Sequence[tuple[str, str]], caller: CallerHeaders) -> MemoryReply:
        """The whole conversation as one ``History``: the proxy answers an export a page at a time (so it
        holds one page per request), and the agent, the compactor and the client get the pages joined.
        Pages of different versions were read while the conversation changed: the export starts over, and
        after ``_EXPORT_ATTEMPTS`` answers what it has with the first page's version, so a write
        conditional on it fails rather than replacing what the export missed."""
        own = [(name, value) for name, value in query if name != api.OFFSET_PARAM]
        # If-None-Match is the first page's: the ETag of a joined document is its first page's.
        later = dataclasses.replace(caller, if_none_match=None)
        for _attempt in range(_EXPORT_ATTEMPTS):
            first = await self._send("GET", "export", path, own, None, caller)
            if first.status != 200 or first.body.endswith(_LAST_PAGE_END):
                # One page is the whole conversation (or a 304): the proxy's answer as it came, not decoded
                # (as a read's answer is passed on).
                return first
            document = _export_page(first, 0)
            entries: list[object] = document["entries"]
            offset, consistent = document["nextOffset"], True
            if offset is None:
                return MemoryReply(200, first.body, first.scope, len(entries), first.version, etag=first.etag)
            while offset is not None:
                page = await self._send("GET", "export", path, [*own, (api.OFFSET_PARAM, str(offset))], None, later)
                if page.status != 200:
                    return page
                more = _export_page(page, offset)
                if more["version"] != document["version"] or not more["entries"]:
                    consistent = False
                    break
                entries += more["entries"]
                offset = more["nextOffset"]
            if consistent:
                break
        document["entries"], document["nextOffset"] = entries, None
        # Pages of one version are the first page's state: its ETag; pages that never agreed have none.
        etag = first.etag if consistent else None
        return MemoryReply(200, orjson.dumps(document), first.scope, len(entries), first.version, etag=etag)

    async def _send(
        self,
        method: str,
        op: str,
        path: str,
        query: Sequence[tuple[str, str]],
        body: bytes | None,
        caller: CallerHeaders,
        idempotent: bool | None = None,
    ) -> MemoryReply:
        pod_query = self._write_query if op in _WRITES else self._read_query
        own = api.query_string([(k, v) for k, v in query if k not in POD_PARAMS])
        target = f"{path}?{own}&{pod_query}" if own else f"{path}?{pod_query}"
        trace: dict[str, str] = {}
        inject_traceparent(trace)  # the memory.<op> span under way, when spans are recorded
        if "traceparent" not in trace and caller.traceparent:
            trace["traceparent"] = caller.traceparent
            if caller.tracestate:
                trace["tracestate"] = caller.tracestate
        headers = [
            (b"content-type", b"application/json"),
            (b"authorization", self._token.authorization()),
            *((k.encode(), v.encode("latin-1")) for k, v in trace.items()),
        ]
        if caller.capability is not None:
            headers.append((api.USER_CAPABILITY_HEADER.encode(), caller.capability.encode("latin-1")))
        if caller.if_match is not None:
            headers.append((_IF_MATCH, caller.if_match.encode("latin-1")))
        if caller.idempotency_key is not None:
            headers.append((_IDEMPOTENCY_KEY, caller.idempotency_key.encode("latin-1")))
        if caller.if_none_match is not None:
            headers.append((_IF_NONE_MATCH, caller.if_none_match.encode("latin-1")))
        if caller.prefer is not None:
            headers.append((_PREFER, caller.prefer.encode("latin-1")))
        try:
            # The transport bounds the call (SESSIONMEM_PROXY_CONNECT_TIMEOUT_SECONDS, ..._PROXY_TIMEOUT_SECONDS).
            response = await self._http.request(method, target, headers, body, idempotent)
        except (OSError, UnicodeError) as exc:  # HttpTimeout is an OSError too
            unavailable = BackendUnavailable(f"memory proxy unreachable: {type(exc).__name__}")
            unavailable.__cause__ = exc
            self.memory.down(cause_of(unavailable))
            raise unavailable from exc
        if response.status == 503 and _error_type(response.body) == BackendUnavailable.error_type:
            # The proxy answered, but its backend did not: the proxy's message says why.
            self.memory.down(f"the proxy answered 503: {_error_message(response.body)}")
        elif response.status < 500 and self.memory.is_down:
            self.memory.up()
        return MemoryReply(
            response.status,
            response.body,
            response.header(_SCOPE),
            _int_header(response, api.ENTRIES_HEADER),
            _int_header(response, api.VERSION_HEADER),
            response.header(_RETRY_AFTER.encode()) if response.status in (429, 503) else None,
            response.header(_ETAG) if response.status < 400 else None,
        )

    async def reach(self, seconds: float) -> bool:
        """Whether the proxy answers at all (any status: its readiness may say Valkey is down) within
        ``seconds``. A new pod's first packets may be refused or dropped until the cluster's NetworkPolicy
        agent admits its address (kube-router's sync takes seconds on a busy node), and a turn taken before
        then would be answered without memory. Fail-open: False after ``seconds``, and the caller goes on."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    await self._http.request("GET", api.PROXY_READY_PATH)
                return True
            except (OSError, TimeoutError):
                if loop.time() + _REACH_RETRY_SECONDS >= deadline:
                    return False
                await asyncio.sleep(_REACH_RETRY_SECONDS)

    async def aclose(self) -> None:
        await self._http.aclose()


def forwarder_from_settings(settings: LauncherSettings, tracer: MemoryTracer) -> Forwarder:
    """The launcher always talks to a proxy: without its URL there is nothing to forward to."""
    if not settings.proxy_url:
        raise ConfigError(
            f"{PROXY_URL} is not set: the launcher forwards memory calls to the state-layer proxy and has no "
            "other way to reach memory"
        )
    transport = HttpClient(
        settings.proxy_url,
        timeout=settings.proxy_timeout_seconds,
        connect_timeout=settings.proxy_connect_timeout_seconds,
    )
    return Forwarder(settings, transport, tracer)


def _int_header(response: HttpResponse, name: str) -> int | None:
    value = response.header(name.encode())
    return int(value) if value is not None and value.isdigit() else None


def _export_page(reply: MemoryReply, offset: int) -> dict[str, Any]:
    """The page of the proxy's export from ``offset``, whose next starts right after its entries; a proxy
    that answers anything else is a backend failing (and could never make an export end)."""
    try:
        page = orjson.loads(reply.body)
        entries, next_offset = page["entries"], page["nextOffset"]
        ends = next_offset is None or (entries and next_offset == offset + len(entries))
        if isinstance(entries, list) and isinstance(page["version"], int) and ends:
            return cast(dict[str, Any], page)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    raise BackendUnavailable("the memory proxy answered an export page that is not one")


def _error_message(body: bytes) -> str:
    try:
        return str(orjson.loads(body)["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")


def _error_type(body: bytes) -> str:
    try:
        return str(orjson.loads(body)["error"]["type"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "upstream_error"
