"""The one reply builder: every answer of the proxy is a ``Reply`` (status, headers as granian's RSGI takes
them, whole body), made here; typed errors become their status and typed body here."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from sessionmem_core import api
from sessionmem_core.errors import SessionMemError, error_body
from sessionmem_infra.serving import JSON_HEADERS

Headers = list[tuple[str, str]]
_SCOPE, _ENTRIES, _VERSION = api.SCOPE_HEADER, api.ENTRIES_HEADER, api.VERSION_HEADER


@dataclass(slots=True)  # not frozen: one is built per request (see sessionmem_proxy.store.AppendResult)
class Reply:
    status: int
    headers: Headers
    body: bytes


def memory_headers(scope: str, entries: int, version: int | None) -> Headers:
    headers = [*JSON_HEADERS, (_SCOPE, scope), (_ENTRIES, str(entries))]
    if version is not None:
        headers.append((_VERSION, str(version)))
    return headers


def json_reply(body: bytes, status: int = 200) -> Reply:
    return Reply(status, JSON_HEADERS, body)


def model_reply(model: BaseModel) -> Reply:
    return Reply(200, JSON_HEADERS, model.model_dump_json(by_alias=True).encode())


def memory_reply(body: bytes | BaseModel, scope: str, entries: int, version: int | None) -> Reply:
    """A memory operation's answer: its body plus the headers that repeat scope, entries and version."""
    raw = body if isinstance(body, bytes) else body.model_dump_json(by_alias=True).encode()
    return Reply(200, memory_headers(scope, entries, version), raw)


def text_reply(body: bytes, content_type: str) -> Reply:
    return Reply(200, [("content-type", content_type)], body)


def error_reply(error: SessionMemError, extra: Headers | None = None) -> Reply:
    return Reply(error.status, [*JSON_HEADERS, *error.headers(), *(extra or ())], error.body())


def internal_error_reply(exc: BaseException) -> Reply:
    # Still a typed body: a client must never have to parse a bare text error.
    return Reply(500, JSON_HEADERS, error_body("internal", f"internal error ({type(exc).__name__})"))
