"""The proxy's OpenAPI document, generated from the route table (``sessionmem_proxy.routes``) by the one
generator (``sessionmem_core.openapi``): the same parameter declarations that parse requests, the wire
models, and exactly the statuses each route answers.

The generated document is committed (docs/openapi/proxy.json) and a test checks it is current;
``python -m sessionmem_proxy.openapi --write`` (or ``make openapi``) regenerates it.
"""

from __future__ import annotations

import argparse
import sys
from functools import cache
from http import HTTPStatus
from pathlib import Path
from typing import Any

from sessionmem_core import api, openapi
from sessionmem_proxy.routes import Route, RouteTable

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi" / "proxy.json"
_ERROR_TEXT = {
    400: "A refused parameter, conversation id or body",
    401: "Missing, invalid or expired token",
    403: "The token is not an agent identity",
    408: "The body did not arrive within the body timeout",
    412: "If-Match does not match the version",
    413: "The body is over the body limit",
    414: "The URL is over the URL limit",
    431: "Too many header fields, or too many header bytes",
    503: "Backend or identity service unavailable, or the worker is at its request limit",
}


def _operation(route: Route[Any]) -> openapi.Operation:
    parameters = [
        api.Parameter(param.name, param.location, param.schema, param.description, param.required)
        for param in route.declared_params
        if param.documented
    ]
    errors = {status: _ERROR_TEXT.get(status, HTTPStatus(status).phrase) for status in route.all_statuses - {200}}
    return openapi.Operation(
        route.op,
        route.method,
        route.path,
        route.summary,
        route.tag,
        parameters,
        route.response,
        errors,
        route.request,
        route.content_type,
    )


def document(table: RouteTable | None = None) -> dict[str, Any]:
    table = table or RouteTable()
    return openapi.document(
        "sessionmem state-layer proxy",
        "Conversation memory for agents: authenticated, keyed server-side, stored in Valkey.",
        [_operation(route) for route in table.routes],
    )


@cache
def document_bytes() -> bytes:
    return openapi.render(document())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the proxy's OpenAPI document, generated from its route table")
    parser.add_argument("--write", action="store_true", help=f"write it to {COMMITTED}")
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed file is not current")
    args = parser.parse_args(argv)
    current = document_bytes()
    if args.write:
        COMMITTED.parent.mkdir(parents=True, exist_ok=True)
        COMMITTED.write_bytes(current)
        return 0
    if args.check:
        return 0 if COMMITTED.exists() and COMMITTED.read_bytes() == current else 1
    sys.stdout.buffer.write(current)
    return 0


if __name__ == "__main__":
    sys.exit(main())
