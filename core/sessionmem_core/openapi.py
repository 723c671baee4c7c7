"""The one OpenAPI generator: the proxy's document and the launcher's are both built here, from the
operations each serves (``Operation``: the memory operations of ``sessionmem_core.api`` with what each
server adds) and the wire models of ``sessionmem_core.wire``. Pure: a document is a dict, rendered to
the committed bytes by ``render``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from sessionmem_core import wire
from sessionmem_core.api import Parameter

_REF = "#/components/schemas/{model}"


@dataclass(frozen=True, slots=True)
class Operation:
    """One documented operation. ``errors``: each error status it may answer, with what it means."""

    op: str
    method: str
    path: str
    summary: str
    tag: str
    parameters: Sequence[Parameter]
    response: type[BaseModel] | None
    errors: Mapping[int, str] = field(default_factory=dict)
    request: type[BaseModel] | None = None
    content_type: str = "application/json"


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _REF.format(model="ErrorResponse")}}},
    }


def _operation(operation: Operation) -> dict[str, Any]:
    parameters = []
    for param in operation.parameters:
        entry: dict[str, Any] = {
            "name": param.name,
            "in": param.location,
            "required": param.required or param.location == "path",
            "schema": dict(param.schema),
        }
        if param.description:
            entry["description"] = param.description
        parameters.append(entry)
    if operation.response is not None:
        schema: dict[str, Any] = {"$ref": _REF.format(model=operation.response.__name__)}
    else:
        schema = {"type": "object" if "json" in operation.content_type else "string"}
    responses: dict[str, Any] = {"200": {"description": "OK", "content": {operation.content_type: {"schema": schema}}}}
    responses |= {
        # Below 400 (a 304 Not Modified): no body, only what it means.
        str(status): _error(text) if status >= 400 else {"description": text}
        for status, text in sorted(operation.errors.items())
    }
    document: dict[str, Any] = {
        "operationId": operation.op,
        "summary": operation.summary,
        "tags": [operation.tag],
        "parameters": parameters,
        "responses": responses,
    }
    if operation.request is not None:
        document["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model=operation.request.__name__)}}},
        }
    return document


def _models(operations: Iterable[Operation]) -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    """Every model the operations name: requests as they are validated, answers as they are written."""
    found: dict[str, tuple[type[BaseModel], JsonSchemaMode]] = {"ErrorResponse": (wire.ErrorResponse, "serialization")}
    for operation in operations:
        if operation.request is not None:
            found[operation.request.__name__] = (operation.request, "validation")
        if operation.response is not None:
            found[operation.response.__name__] = (operation.response, "serialization")
    return [found[name] for name in sorted(found)]


def document(title: str, description: str, operations: Sequence[Operation]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        paths.setdefault(operation.path, {})[operation.method.lower()] = _operation(operation)
    _, schemas = models_json_schema(_models(operations), ref_template=_REF)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1", "description": description},
        "paths": paths,
        "components": {"schemas": schemas.get("$defs", {})},
    }


def render(document: Mapping[str, Any]) -> bytes:
    """The document as committed: indented, keys sorted, one final newline."""
    return orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
