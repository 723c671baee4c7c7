"""A hello world on the proxy's own HTTP server (``sessionmem_core.http_server``), served the way the proxy
serves its two per-turn operations: a routed handler, no framework in between.

Not a target: context for the framework ceiling. The proxy is compared with a FastAPI hello world on uvicorn
(what an ordinary FastAPI service costs); this row shows what the server the proxy runs on costs by itself,
so the difference to the proxy's row is the proxy's own work (auth, keying, the Valkey call, the answer).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import MutableMapping
from typing import Any

import uvloop

from bench.hello import BODY, JSON
from sessionmem_core.http_server import DirectHandler, HttpRequest, HttpServer, Reply

_HEADERS = ((b"content-type", JSON.encode()),)


async def _hello(_: HttpRequest) -> Reply:
    return Reply(200, _HEADERS, BODY)


def _route(method: bytes, path: str) -> DirectHandler | None:
    return _hello if path in ("/hello", "/healthz") else None


async def _not_found(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 404, "headers": list(_HEADERS)})
    await send({"type": "http.response.body", "body": b'{"error":"not found"}'})


async def _serve(port: int) -> None:
    server = HttpServer(_not_found, 1 << 20, router=_route)
    await server.start("127.0.0.1", port)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    uvloop.run(_serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
