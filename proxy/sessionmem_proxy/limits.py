"""The serving limits the app enforces itself, with typed answers (docs/limits.md says which layer
enforces which limit: the HTTP server, granian/hyper, bounds the head's bytes and the time to read it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from sessionmem_core.env import ServingLimits
from sessionmem_core.errors import HeadersTooLarge, InvalidRequest, PayloadTooLarge, RequestTimeout, UriTooLong
from sessionmem_infra.deadlines import Deadlines

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class RequestLimits:
    """The checks of the serving limits that the app makes itself, per request."""

    __slots__ = ("_body_deadlines", "max_in_flight", "serving", "stall_timeout_seconds")

    def __init__(self, serving: ServingLimits) -> None:
        self.serving = serving
        self.max_in_flight = serving.max_connections
        # A streamed answer the client stops reading is cut off after this long without progress.
        self.stall_timeout_seconds = serving.idle_timeout_seconds
        self._body_deadlines = Deadlines(serving.body_timeout_seconds)

    def check_head(self, raw_path: bytes, query: bytes, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """414 for a URL over the limit, 431 for too many header fields or too many header bytes."""
        if len(raw_path) + len(query) + (1 if query else 0) > self.serving.max_url_bytes:
            raise UriTooLong(f"the request target exceeds {self.serving.max_url_bytes} bytes")
        count = size = 0
        for name, value in headers:
            count += 1
            size += len(name) + len(value) + 4  # "name: value\r\n"
        if count > self.serving.max_header_count:
            raise HeadersTooLarge(f"more than {self.serving.max_header_count} header fields")
        if size > self.serving.max_header_bytes:
            raise HeadersTooLarge(f"header fields exceed {self.serving.max_header_bytes} bytes")

    async def read_body(self, receive: Receive, content_length: str | None, meter: BodyMeter) -> bytes:
        """The whole body, counted while it streams in; 413 over the limit, 408 when the body timeout
        passes first. ``meter`` counts every byte received, kept or dropped, also when this raises: what
        the client made the proxy take is charged to it either way.

        Over the limit (declared or counted), nothing more is kept, but what the client is still sending
        is read and dropped, up to as much again and within the body timeout: closing on unread bytes
        makes the kernel reset the connection, and a client still uploading would then never read its
        413. Memory stays bounded by the limit; time by the body timeout."""
        limit = self.serving.max_body_bytes
        declared = content_length is not None and content_length.isascii() and content_length.isdigit()
        expected = int(content_length or 0) if declared else -1
        too_large = expected > limit
        chunks: list[bytes] = []
        try:
            with self._body_deadlines.timeout():
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        # The body stopped short: the client went away, or its framing was broken (a
                        # malformed chunk ends the stream the same way). The typed answer is for the latter;
                        # a client that left never reads it.
                        raise InvalidRequest("the request body ended early or its framing is malformed")
                    chunk = message.get("body", b"")
                    meter.received += len(chunk)
                    too_large = too_large or meter.received > limit
                    if not too_large:
                        chunks.append(chunk)
                    elif meter.received > 2 * limit:
                        break
                    if not message.get("more_body", False) or meter.received == expected:
                        # hyper delivers no byte past a declared length, so once it has all arrived the
                        # body is whole: waiting for granian's closing empty message costs a hand-off.
                        break
        except TimeoutError as exc:
            if not too_large:
                raise RequestTimeout(
                    f"request body not received within {self.serving.body_timeout_seconds:g} s"
                ) from exc
        if too_large:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        return b"".join(chunks)


class BodyMeter:
    """How many bytes of a request body the proxy has taken so far."""

    __slots__ = ("received",)

    def __init__(self) -> None:
        self.received = 0


class InFlight:
    """Counts the requests a worker is serving; ``enter`` says False when it already serves its maximum
    (the caller answers 503 without reading the request)."""

    __slots__ = ("count", "maximum")

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.count = 0

    def enter(self) -> bool:
        if self.count >= self.maximum:
            return False
        self.count += 1
        return True

    def leave(self) -> None:
        self.count -= 1
