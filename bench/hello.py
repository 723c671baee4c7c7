"""The framework ceiling: a hello-world FastAPI app served like the proxy (uvicorn, uvloop, httptools).

``GET /hello`` is the ceiling the benchmark compares the proxy with. The ``/x/...`` routes are the
profiling experiments (``python -m bench.profile``): the same trivial answer behind one piece of what the
proxy's routes do, so each piece's cost per request can be read off as a difference in throughput.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

BODY = b'{"status":"ok"}'
# About the size of a read(40) answer in the benchmark (40 entries of ~270 bytes).
LARGE_BODY = b'{"entries":[' + b",".join([b'{"content":"' + b"x" * 255 + b'"}'] * 40) + b"]}"
JSON = "application/json"


class _Context:
    """Stands for the proxy's ProxyContext: what a route gets from ``app.state`` by dependency injection."""


def _sync_context(request: Request) -> _Context:
    # Like sessionmem_proxy.admission._context: a plain ``def`` dependency (FastAPI runs it in a thread pool).
    ctx: _Context = request.app.state.ctx
    return ctx


async def _async_context(request: Request) -> _Context:
    ctx: _Context = request.app.state.ctx
    return ctx


SyncCtx = Annotated[_Context, Depends(_sync_context)]
AsyncCtx = Annotated[_Context, Depends(_async_context)]


async def _raw_asgi(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", JSON.encode())]})
    await send({"type": "http.response.body", "body": BODY})


def create_app() -> FastAPI:
    app = FastAPI(title="hello")
    app.state.ctx = _Context()

    @app.get("/hello")
    async def hello() -> Response:
        return Response(content=BODY, media_type=JSON)

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(content=BODY, media_type=JSON)

    @app.get("/x/large")
    async def large() -> Response:
        return Response(content=LARGE_BODY, media_type=JSON)

    @app.get("/x/sync-dep")
    async def sync_dep(ctx: SyncCtx) -> Response:
        return Response(content=BODY, media_type=JSON)

    @app.get("/x/async-dep")
    async def async_dep(ctx: AsyncCtx) -> Response:
        return Response(content=BODY, media_type=JSON)

    # The read route's signature (sessionmem_proxy.app.read_entries): a context dependency, a path
    # parameter, three query parameters and three headers, all parsed and validated by FastAPI.
    @app.get("/x/params-sync/{conversation_id:path}")
    async def params_sync(
        ctx: SyncCtx,
        conversation_id: str,
        limit: Annotated[int, Query(ge=0, le=500)] = 40,
        summary: Annotated[bool, Query()] = False,
        scope: Annotated[str, Query()] = "session",
        authorization: Annotated[str | None, Header()] = None,
        traceparent: Annotated[str | None, Header()] = None,
        x_sessionmem_user_capability: Annotated[str | None, Header()] = None,
    ) -> Response:
        return Response(content=BODY, media_type=JSON)

    @app.get("/x/params-async/{conversation_id:path}")
    async def params_async(
        ctx: AsyncCtx,
        conversation_id: str,
        limit: Annotated[int, Query(ge=0, le=500)] = 40,
        summary: Annotated[bool, Query()] = False,
        scope: Annotated[str, Query()] = "session",
        authorization: Annotated[str | None, Header()] = None,
        traceparent: Annotated[str | None, Header()] = None,
        x_sessionmem_user_capability: Annotated[str | None, Header()] = None,
    ) -> Response:
        return Response(content=BODY, media_type=JSON)

    @app.get("/x/request/{conversation_id:path}")
    async def from_request(request: Request) -> Response:
        # The same inputs read by hand from the request (no FastAPI parameter resolution).
        limit = int(request.query_params.get("limit", "40"))
        _ = (request.path_params["conversation_id"], limit, request.headers.get("authorization"))
        return Response(content=BODY, media_type=JSON)

    # A bare ASGI app behind the same middleware stack: the floor of the FastAPI/Starlette app.
    app.mount("/x/asgi", _raw_asgi)

    # The plain route plus the proxy's one Valkey call of a read (LRANGE -40 -1 through the proxy's own
    # client, RespClient for a standalone URL): the ceiling of a FastAPI proxy in front of Valkey.
    valkey_url = os.environ.get("BENCH_VALKEY_URL")
    if valkey_url:
        from sessionmem_proxy.valkey_client import connect

        client: Any = connect(valkey_url, 1.0)
        key = os.environ.get("BENCH_VALKEY_KEY", "bench:ceiling:read:000000000000")

        @app.get("/x/valkey-read")
        async def valkey_read() -> Response:
            raw: list[bytes] = await client.lrange(key, -40, -1)
            return Response(content=b"[" + b",".join(raw) + b"]", media_type=JSON)

    return app
