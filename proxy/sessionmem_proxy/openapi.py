"""The proxy's OpenAPI document, generated from the route table (``sessionmem_proxy.routes``): the same
parameter declarations that parse requests, the wire models, and exactly the statuses each route answers.

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

import orjson
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from sessionmem_core import wire
from sessionmem_proxy.routes import Route, RouteTable

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi" / "proxy.json"
_REF = "#/components/schemas/{model}"
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


def _models(table: RouteTable) -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    """Every model the table names: requests as they are validated, responses as they are written."""
    found: dict[str, tuple[type[BaseModel], JsonSchemaMode]] = {"ErrorResponse": (wire.ErrorResponse, "serialization")}
    for route in table.routes:
        if route.request is not None:
            found[route.request.__name__] = (route.request, "validation")
        if route.response is not None:
            found[route.response.__name__] = (route.response, "serialization")
    return [found[name] for name in sorted(found)]


def _operation(route: Route[Any]) -> dict[str, Any]:
    parameters = []
    for param in route.declared_params:
        if not param.documented:
            continue
        entry: dict[str, Any] = {
            "name": param.name,
            "in": param.location,
            "required": param.required or param.location == "path",
            "schema": dict(param.schema),
        }
        if param.description:
            entry["description"] = param.description
        parameters.append(entry)
    responses: dict[str, Any] = {}
    for status in sorted(route.all_statuses):
        if status == 200:
            if route.response is not None:
                content = {route.content_type: {"schema": {"$ref": _REF.format(model=route.response.__name__)}}}
            else:
                content = {
                    route.content_type: {"schema": {"type": "object" if "json" in route.content_type else "string"}}
                }
            responses["200"] = {"description": "OK", "content": content}
        else:
            responses[str(status)] = {
                "description": _ERROR_TEXT.get(status, HTTPStatus(status).phrase),
                "content": {"application/json": {"schema": {"$ref": _REF.format(model="ErrorResponse")}}},
            }
    operation: dict[str, Any] = {
        "operationId": route.op,
        "summary": route.summary,
        "tags": [route.tag],
        "parameters": parameters,
        "responses": responses,
    }
    if route.request is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model=route.request.__name__)}}},
        }
    return operation


def document(table: RouteTable | None = None) -> dict[str, Any]:
    table = table or RouteTable()
    paths: dict[str, dict[str, Any]] = {}
    for route in table.routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    _, schemas = models_json_schema(_models(table), ref_template=_REF)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sessionmem state-layer proxy",
            "version": "1",
            "description": "Conversation memory for agents: authenticated, keyed server-side, stored in Valkey.",
        },
        "paths": paths,
        "components": {"schemas": schemas.get("$defs", {})},
    }


@cache
def document_bytes() -> bytes:
    return orjson.dumps(document(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


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
