"""The few ASGI helpers the launcher's two small apps share (no web framework: the launcher runs in
every agent pod and on every cold start, so it stays light)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from sessionmem_core.errors import PayloadTooLarge, SessionMemError

if TYPE_CHECKING:  # the launcher does not import Starlette at run time
    from starlette.types import Receive, Send

JSON_HEADERS = ((b"content-type", b"application/json"),)


async def read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def respond(send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = JSON_HEADERS) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def respond_error(send: Send, error: SessionMemError) -> None:
    await respond(send, error.status, error.body())


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None
