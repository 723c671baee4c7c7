"""The agent's memory endpoint on 127.0.0.1: the proxy's API, forwarded with the pod's identity.

Only an allow-list of headers crosses (content type, trace context, the signed user capability), so an
identity header the agent sets never reaches the proxy. Every operation is one ``memory.<op>`` span.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

import orjson

from sessionmem_core import api, env
from sessionmem_core.errors import InvalidRequest, SessionMemError
from sessionmem_core.ids import validate_conversation_id
from sessionmem_core.telemetry import MemoryTracer
from sessionmem_launcher.asgi import header, read_body, respond, respond_error
from sessionmem_launcher.memory_client import MemoryClient

if TYPE_CHECKING:  # the launcher does not import Starlette at run time
    from starlette.types import Receive, Scope, Send


class MemoryEndpoint:
    def __init__(self, client: MemoryClient, tracer: MemoryTracer) -> None:
        self._client = client
        self._tracer = tracer

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
            await self._forward(scope, receive, send, op, conversation_id)
        except SessionMemError as exc:
            await respond_error(send, exc)

    async def _forward(self, scope: Scope, receive: Receive, send: Send, op: str, conversation_id: str | None) -> None:
        headers = scope["headers"]
        traceparent = header(headers, b"traceparent")
        with self._tracer.span(op, conversation_id or "", traceparent, header(headers, b"tracestate")) as span:
            if conversation_id is not None:
                validate_conversation_id(conversation_id)
            body = await read_body(receive, env.MAX_BODY_BYTES)
            if op in ("append", "replace") and not body:
                raise InvalidRequest("request body is required")
            query = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
            response = await self._client.call(
                scope["method"],
                api.memory_path(op, conversation_id, scope["path"]),
                query,
                body or None,
                capability=header(headers, api.USER_CAPABILITY_HEADER.encode()),
                traceparent=traceparent,
                if_match=header(headers, b"if-match"),
            )
            span.scope, span.entries, span.version = response.scope, response.entries, response.version
            if response.status >= 400:
                span.fail(_error_type(response.body))
        await respond(send, response.status, response.body)


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
