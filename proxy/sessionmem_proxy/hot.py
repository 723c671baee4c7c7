"""The hot path: reading the window and appending the exchange, once per agent turn each.

``read_conversation`` and ``append_conversation`` are the one implementation of the two operations, and
``serve_entries`` the one reading of their HTTP inputs. The FastAPI routes call the operations (and
document them in the OpenAPI); ``HotRoutes`` serves them straight from the proxy's HTTP server, and
``HotPath`` from ASGI (the in-process app a launcher in direct mode runs), both skipping the framework's
routing, middleware and parameter solving, which cost more than the operation itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from sessionmem_core import api, env, wire
from sessionmem_core.errors import InvalidRequest, SessionMemError, error_body
from sessionmem_core.http_server import DirectHandler, HttpRequest, Reply
from sessionmem_core.ids import validate_conversation_id
from sessionmem_core.keys import Scope as MemoryScope
from sessionmem_core.store import NewEntry
from sessionmem_proxy.context import ProxyContext, conversation_operation

JSON = "application/json"
JSON_HEADERS = ((b"content-type", JSON.encode()),)
_SCOPE_HEADER, _ENTRIES_HEADER, _VERSION_HEADER = (
    h.lower().encode() for h in (api.SCOPE_HEADER, api.ENTRIES_HEADER, api.VERSION_HEADER)
)
_LOG = logging.getLogger("sessionmem.proxy")


def memory_reply(body: bytes, scope: str, entries: int, version: int | None) -> Reply:
    headers = [*JSON_HEADERS, (_SCOPE_HEADER, scope.encode()), (_ENTRIES_HEADER, b"%d" % entries)]
    if version is not None:
        headers.append((_VERSION_HEADER, b"%d" % version))
    return Reply(200, headers, body)


def error_reply(error: SessionMemError) -> Reply:
    return Reply(error.status, [*JSON_HEADERS, *error.headers()], error.body())


def internal_error_body(exc: Exception) -> bytes:
    # Still a typed body: a client must never have to parse a bare text error.
    return error_body("internal", f"internal error ({type(exc).__name__})")


def as_response(reply: Reply) -> Response:
    response = Response(content=reply.body, status_code=reply.status)
    response.raw_headers = [*reply.headers, (b"content-length", b"%d" % len(reply.body))]
    return response


def memory_json(body: bytes, scope: str, entries: int, version: int | None) -> Response:
    return as_response(memory_reply(body, scope, entries, version))


async def new_entries(ctx: ProxyContext, entries: Sequence[wire.EntryIn], redact: str) -> list[NewEntry]:
    redactor = ctx.redaction.chain(redact.split(",")) if redact else None
    if redactor is None:
        return [NewEntry(role=e.role.value, content=e.content, id=e.id) for e in entries]
    contents = await ctx.redaction.apply(redactor, [e.content for e in entries])
    return [NewEntry(role=e.role.value, content=c, id=e.id) for e, c in zip(entries, contents, strict=True)]


async def read_conversation(
    ctx: ProxyContext,
    conversation_id: str,
    limit: int,
    summary: bool,
    scope: MemoryScope,
    authorization: str | None,
    capability: str | None,
    traceparent: str | None,
) -> Reply:
    async with conversation_operation(
        ctx, "get", conversation_id, scope, authorization, capability, traceparent
    ) as operation:
        result = await (
            ctx.store.read_with_summary(operation.key, limit) if summary else ctx.store.read(operation.key, limit)
        )
        operation.span.entries, operation.span.version = len(result.raw_entries), result.version
        summary_part = (b',"summary":' + result.raw_summary) if result.raw_summary else b""
        body = b"".join(
            (
                b'{"conversationId":',
                orjson.dumps(conversation_id),
                b',"scope":"',
                operation.scope.encode(),
                b'","version":',
                str(result.version).encode(),
                b',"entries":',
                result.entries_json(),
                summary_part,
                b"}",
            )
        )
        return memory_reply(body, operation.scope, len(result.raw_entries), result.version)


async def append_conversation(
    ctx: ProxyContext,
    conversation_id: str,
    entries: Sequence[wire.EntryIn],
    scope: MemoryScope,
    cap: int,
    ttl_seconds: int,
    redact: str,
    authorization: str | None,
    capability: str | None,
    traceparent: str | None,
) -> Reply:
    async with conversation_operation(
        ctx, "append", conversation_id, scope, authorization, capability, traceparent
    ) as operation:
        result = await ctx.store.append(
            operation.key,
            await new_entries(ctx, entries, redact),
            author=operation.identity.owner.author,
            cap=cap,
            ttl_seconds=ttl_seconds,
        )
        operation.span.entries, operation.span.version = result.stored, result.version
        duplicate = b"true" if result.duplicate else b"false"
        return memory_reply(
            b'{"version":%d,"stored":%d,"duplicate":%s,"scope":"%s","length":%d,"duplicateIds":%s}'
            % (
                result.version,
                result.stored,
                duplicate,
                operation.scope.encode(),
                result.length,
                orjson.dumps(result.duplicate_ids),
            ),
            operation.scope,
            result.stored,
            result.version,
        )


def _int_param(params: dict[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not lo <= int(raw) <= hi:
        raise InvalidRequest(f"query.{name}: must be an integer from {lo} to {hi}")
    return int(raw)


def _scope_param(params: dict[str, str]) -> MemoryScope:
    raw = params.get(api.SCOPE_PARAM, MemoryScope.SESSION.value)
    try:
        return MemoryScope(raw)
    except ValueError as exc:
        raise InvalidRequest(f"query.scope: must be one of {[s.value for s in MemoryScope]}") from exc


def _bool_param(params: dict[str, str], name: str) -> bool:
    raw = params.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        raise InvalidRequest(f"query.{name}: must be a boolean")
    return raw in ("true", "1", "yes", "on")


async def serve_entries(
    ctx: ProxyContext, op: str, conversation_id: str, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> Reply:
    """GET (``op`` "get") or POST (``op`` "append") ``.../conversations/{id}/entries``, from the raw
    request; a typed error becomes its typed answer."""
    try:
        return await _serve(ctx, op, conversation_id, query, dict(headers), body)
    except SessionMemError as exc:
        return error_reply(exc)


async def _serve(
    ctx: ProxyContext, op: str, conversation_id: str, query: bytes, headers: dict[bytes, bytes], body: bytes
) -> Reply:
    authorization = _header(headers, b"authorization")
    capability = _header(headers, _CAPABILITY_HEADER)
    traceparent = _header(headers, b"traceparent")
    params = dict(api.parse_query(query))
    validate_conversation_id(conversation_id)
    if op == "get":
        limit = _int_param(params, api.LIMIT_PARAM, env.DEFAULT_REPLAY_MESSAGES, 0, env.MAX_READ_LIMIT)
        return await read_conversation(
            ctx,
            conversation_id,
            limit,
            _bool_param(params, "summary"),
            _scope_param(params),
            authorization,
            capability,
            traceparent,
        )
    cap = _int_param(params, api.CAP_PARAM, env.DEFAULT_CAP, 1, env.MAX_CAP)
    ttl = _int_param(params, api.TTL_PARAM, env.DEFAULT_TTL_SECONDS, 1, env.MAX_TTL_SECONDS)
    try:
        request = wire.AppendRequest.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidRequest(_problems(exc.errors())) from exc
    return await append_conversation(
        ctx,
        conversation_id,
        request.entries,
        _scope_param(params),
        cap,
        ttl,
        params.get(api.REDACT_PARAM, ""),
        authorization,
        capability,
        traceparent,
    )


def _entries_route(method: str, path: str) -> tuple[str, str] | None:
    """(operation, conversation id) when this is a read or an append of entries, else None."""
    if not path.endswith("/entries") or method not in ("GET", "POST"):
        return None
    try:
        op, conversation_id = api.memory_route(method, path)
    except SessionMemError:
        return None  # not one of ours: the framework answers it (a 404 naming what is wrong)
    return op, conversation_id or ""


class HotRoutes:
    """The ``Router`` of the proxy's HTTP server: claims the two per-turn operations, leaves the rest to
    the FastAPI app."""

    def __init__(self, ctx: ProxyContext) -> None:
        self.ctx = ctx

    def __call__(self, method: bytes, path: str) -> DirectHandler | None:
        route = _entries_route(method.decode("latin-1"), path)
        if route is None:
            return None
        op, conversation_id = route
        ctx = self.ctx

        async def handle(request: HttpRequest) -> Reply:
            try:
                return await serve_entries(ctx, op, conversation_id, request.query, request.headers, request.body)
            except Exception as exc:
                _LOG.exception("unhandled error")
                return Reply(500, JSON_HEADERS, internal_error_body(exc))

        return handle


class HotPath:
    """ASGI middleware serving GET and POST ``/v1/conversations/{id}/entries`` directly; everything else
    goes on to the framework."""

    def __init__(self, app: ASGIApp, ctx: ProxyContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = _entries_route(scope.get("method", ""), scope.get("path", "")) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        op, conversation_id = route
        body = await _read_body(receive) if op == "append" else b""
        reply = await serve_entries(self.ctx, op, conversation_id, scope["query_string"], scope["headers"], body)
        await as_response(reply)(scope, receive, send)


_CAPABILITY_HEADER = api.USER_CAPABILITY_HEADER.lower().encode()


def _header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return value.decode("latin-1") if value is not None else None


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _problems(errors: Sequence[Any]) -> str:
    return (
        "; ".join(
            f"body.{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg', 'invalid')}" for err in errors[:5]
        )
        or "invalid body"
    )
