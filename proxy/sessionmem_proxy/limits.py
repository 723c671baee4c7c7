"""ASGI middleware that refuses request bodies over the limit before they are buffered."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sessionmem_core.errors import PayloadTooLarge


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                if value.isdigit() and int(value) > self.max_bytes:
                    await _reject(send, self.max_bytes)
                    return
                break
        received = 0
        limit = self.max_bytes

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise PayloadTooLarge(f"request body exceeds {limit} bytes")
            return message

        await self.app(scope, counting_receive, send)


async def _reject(send: Send, limit: int) -> None:
    body = PayloadTooLarge(f"request body exceeds {limit} bytes").body()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
