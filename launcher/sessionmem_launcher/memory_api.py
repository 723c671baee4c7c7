"""The agent's memory endpoint on 127.0.0.1: the proxy's API, forwarded with the pod's identity.

Only an allow-list of headers crosses (content type, trace context, the signed user capability), so an
identity header the agent sets never reaches the proxy. Every operation is one ``memory.<op>`` span.

``MemoryEndpoint.forward`` is the one implementation of the forwarding. ``MemoryEndpoint.route`` is the
``Router`` of the endpoint's HTTP server: every memory operation goes straight to ``forward`` from the
parsed request, since building an ASGI scope and ``receive``/``send`` messages for each cost a sizeable
share of the launcher's CPU per call. The ASGI app itself serves ``/healthz``, ``/openapi.json`` and the
404s, and adapts whatever memory operation reaches it (when served without the router) to ``forward``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING

import orjson

from sessionmem_core import api, env
from sessionmem_core.errors import InvalidRequest, PayloadTooLarge, SessionMemError
from sessionmem_core.http_server import DirectHandler, HttpRequest, Reply
from sessionmem_core.ids import validate_conversation_id
from sessionmem_core.telemetry import MemoryTracer
from sessionmem_launcher.asgi import JSON_HEADERS, header, read_body, respond, respond_error
from sessionmem_launcher.memory_client import MemoryClient

if TYPE_CHECKING:  # the launcher does not import Starlette at run time
    from starlette.types import Receive, Scope, Send

_CAPABILITY = api.USER_CAPABILITY_HEADER.encode()


class MemoryEndpoint:
    def __init__(self, client: MemoryClient, tracer: MemoryTracer) -> None:
        self._client = client
        self._tracer = tracer

    def route(self, method: bytes, path: str) -> DirectHandler | None:
        """Claims the memory operations; anything ``api.memory_route`` refuses is left to the ASGI app,
        which answers it with the same typed error (or is ``/healthz`` or ``/openapi.json``)."""
        text_method = method.decode("latin-1")
        try:
            op, conversation_id = api.memory_route(text_method, path)
        except SessionMemError:
            return None
        forward = self.forward

        async def handle(request: HttpRequest) -> Reply:
            return await forward(
                text_method, request.path, op, conversation_id, request.query, request.headers, request.body
            )

        return handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path == "/healthz":
            await respond(send, 200, b'{"status":"ok"}')
            return
        if path == "/openapi.json":
            await respond(send, 200, launcher_openapi())
            return
        try:
            op, conversation_id = api.memory_route(scope["method"], path)
            body = await read_body(receive, env.MAX_BODY_BYTES)
        except SessionMemError as exc:
            await respond_error(send, exc)
            return
        reply = await self.forward(
            scope["method"], path, op, conversation_id, scope["query_string"], scope["headers"], body
        )
        await respond(send, reply.status, reply.body, reply.headers)

    async def forward(
        self,
        method: str,
        path: str,
        op: str,
        conversation_id: str | None,
        query: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
    ) -> Reply:
        """Forward one memory operation (``op`` and ``conversation_id`` from ``api.memory_route``) and
        answer with the proxy's status and body; a typed error becomes its typed answer."""
        traceparent = header(headers, b"traceparent")
        try:
            with self._tracer.span(op, conversation_id or "", traceparent, header(headers, b"tracestate")) as span:
                if conversation_id is not None:
                    validate_conversation_id(conversation_id)
                # The HTTP server refuses a larger body before it gets here, unless it was given a larger limit.
                if len(body) > env.MAX_BODY_BYTES:
                    raise PayloadTooLarge(f"request body exceeds {env.MAX_BODY_BYTES} bytes")
                if op in ("append", "replace") and not body:
                    raise InvalidRequest("request body is required")
                response = await self._client.call(
                    method,
                    api.memory_path(op, conversation_id, path),
                    api.parse_query(query),
                    body or None,
                    capability=header(headers, _CAPABILITY),
                    traceparent=traceparent,
                    if_match=header(headers, b"if-match"),
                )
                span.scope, span.entries, span.version = response.scope, response.entries, response.version
                if response.status >= 400:
                    span.fail(_error_type(response.body))
        except SessionMemError as exc:
            return Reply(exc.status, JSON_HEADERS, exc.body())
        return Reply(response.status, JSON_HEADERS, response.body)


def _error_type(body: bytes) -> str:
    try:
        return str(orjson.loads(body)["error"]["type"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "upstream_error"


@cache
def launcher_openapi() -> bytes:
    """The launcher serves the proxy's memory API minus what the launcher sets itself (scope, cap, TTL,
    credentials). Built on first request only: FastAPI is not loaded otherwise."""
    from sessionmem_core.env import ProxySettings
    from sessionmem_proxy.app import create_app
    from sessionmem_proxy.identity import DevAuthenticator

    doc = create_app(ProxySettings.from_env({}), authenticator=DevAuthenticator()).openapi()
    doc["info"]["title"] = "sessionmem launcher memory endpoint"
    doc["info"]["description"] = "The agent's localhost memory API; identity, scope, cap and TTL come from the pod."
    own = {api.SCOPE_PARAM, api.CAP_PARAM, api.TTL_PARAM, api.REDACT_PARAM, "authorization"}
    paths = {}
    for path, item in doc["paths"].items():
        if path in ("/readyz", "/metrics"):
            continue
        for operation in item.values():
            operation["parameters"] = [p for p in operation.get("parameters", []) if p["name"].lower() not in own]
        paths[path] = item
    doc["paths"] = paths
    return orjson.dumps(doc)
