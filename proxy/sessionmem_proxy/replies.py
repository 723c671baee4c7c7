"""The one reply builder: every answer of the proxy is a ``Reply`` (whole body) or a ``StreamReply`` (body
sent in chunks as it is read), made here; typed errors become their status and typed body here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from sessionmem_core import api
from sessionmem_core.errors import SessionMemError, error_body

JSON = b"application/json"
Headers = Sequence[tuple[bytes, bytes]]
_JSON_HEADERS: Headers = ((b"content-type", JSON),)
_SCOPE, _ENTRIES, _VERSION = (h.encode() for h in (api.SCOPE_HEADER, api.ENTRIES_HEADER, api.VERSION_HEADER))


@dataclass(slots=True)  # not frozen: one is built per request (see sessionmem_proxy.store.AppendResult)
class Reply:
    status: int
    headers: Headers
    body: bytes


@dataclass(frozen=True, slots=True)
class StreamReply:
    """A body too large to hold: the chunks are sent as they come, with transfer-encoding chunked."""

    status: int
    headers: Headers
    chunks: AsyncIterator[bytes]
    # Called once the stream has ended, however it ended (sent whole, failed, or the client went away).
    on_close: Callable[[], None] | None = None


def memory_headers(scope: str, entries: int, version: int | None) -> list[tuple[bytes, bytes]]:
    headers = [*_JSON_HEADERS, (_SCOPE, scope.encode()), (_ENTRIES, b"%d" % entries)]
    if version is not None:
        headers.append((_VERSION, b"%d" % version))
    return headers


def json_reply(body: bytes, status: int = 200) -> Reply:
    return Reply(status, _JSON_HEADERS, body)


def model_reply(model: BaseModel) -> Reply:
    return Reply(200, _JSON_HEADERS, model.model_dump_json(by_alias=True).encode())


def memory_reply(body: bytes | BaseModel, scope: str, entries: int, version: int | None) -> Reply:
    """A memory operation's answer: its body plus the headers that repeat scope, entries and version."""
    raw = body if isinstance(body, bytes) else body.model_dump_json(by_alias=True).encode()
    return Reply(200, memory_headers(scope, entries, version), raw)


def text_reply(body: bytes, content_type: bytes) -> Reply:
    return Reply(200, ((b"content-type", content_type),), body)


def error_reply(error: SessionMemError, extra: Headers = ()) -> Reply:
    return Reply(error.status, (*_JSON_HEADERS, *error.headers(), *extra), error.body())


def internal_error_reply(exc: BaseException) -> Reply:
    # Still a typed body: a client must never have to parse a bare text error.
    return Reply(500, _JSON_HEADERS, error_body("internal", f"internal error ({type(exc).__name__})"))
