"""The hot path: reading the window and appending the exchange, once per agent turn each.

``read_conversation`` and ``append_conversation`` are the one implementation of the two operations; the
FastAPI routes call them (and document them in the OpenAPI), and ``HotPath`` calls them straight from
ASGI, skipping the framework's routing and parameter solving, which cost more than the operation itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl

import orjson
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from sessionmem_core import api, env, wire
from sessionmem_core.errors import InvalidRequest, SessionMemError
from sessionmem_core.ids import validate_conversation_id
from sessionmem_core.keys import Scope as MemoryScope
from sessionmem_core.store import NewEntry
from sessionmem_proxy.context import ProxyContext, conversation_operation

JSON = "application/json"


def memory_json(body: bytes, scope: str, entries: int, version: int | None) -> Response:
    headers = {api.SCOPE_HEADER: scope, api.ENTRIES_HEADER: str(entries)}
    if version is not None:
        headers[api.VERSION_HEADER] = str(version)
    return Response(content=body, media_type=JSON, headers=headers)


def new_entries(ctx: ProxyContext, entries: Sequence[wire.EntryIn], redact: str) -> list[NewEntry]:
    redactor = ctx.redaction.chain(redact.split(",")) if redact else None
    if redactor is None:
        return [NewEntry(role=e.role.value, content=e.content, id=e.id) for e in entries]
    return [NewEntry(role=e.role.value, content=redactor(e.content), id=e.id) for e in entries]


async def read_conversation(
    ctx: ProxyContext,
    conversation_id: str,
    limit: int,
    summary: bool,
    scope: MemoryScope,
    authorization: str | None,
    capability: str | None,
    traceparent: str | None,
) -> Response:
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
        return memory_json(body, operation.scope, len(result.raw_entries), result.version)


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
) -> Response:
    async with conversation_operation(
        ctx, "append", conversation_id, scope, authorization, capability, traceparent
    ) as operation:
        result = await ctx.store.append(
            operation.key,
            new_entries(ctx, entries, redact),
            author=operation.identity.owner.author,
            cap=cap,
            ttl_seconds=ttl_seconds,
        )
        operation.span.entries, operation.span.version = result.stored, result.version
        duplicate = b"true" if result.duplicate else b"false"
        return memory_json(
            b'{"version":%d,"stored":%d,"duplicate":%s,"scope":"%s","length":%d}'
            % (result.version, result.stored, duplicate, operation.scope.encode(), result.length),
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


class HotPath:
    """Serves GET and POST ``/v1/conversations/{id}/entries`` directly; everything else goes on to the
    framework."""

    def __init__(self, app: ASGIApp, ctx: ProxyContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        method = scope.get("method")
        if scope["type"] != "http" or not path.endswith("/entries") or method not in ("GET", "POST"):
            await self.app(scope, receive, send)
            return
        try:
            op, conversation_id = api.memory_route(method, path)
        except SessionMemError:
            await self.app(scope, receive, send)
            return
        try:
            response = await self._serve(scope, receive, op, conversation_id or "")
        except SessionMemError as exc:
            response = Response(content=exc.body(), status_code=exc.status, media_type=JSON)
        await response(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, op: str, conversation_id: str) -> Response:
        headers: dict[bytes, bytes] = dict(scope["headers"])
        authorization = _header(headers, b"authorization")
        capability = _header(headers, api.USER_CAPABILITY_HEADER.encode())
        traceparent = _header(headers, b"traceparent")
        params = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        validate_conversation_id(conversation_id)
        if op == "get":
            limit = _int_param(params, api.LIMIT_PARAM, env.DEFAULT_REPLAY_MESSAGES, 0, env.MAX_READ_LIMIT)
            return await read_conversation(
                self.ctx,
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
        body = await _read_body(receive)
        try:
            request = wire.AppendRequest.model_validate_json(body)
        except ValidationError as exc:
            raise InvalidRequest(_problems(exc.errors())) from exc
        return await append_conversation(
            self.ctx,
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
