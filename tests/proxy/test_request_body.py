"""How the proxy takes a request body from granian's ASGI ``receive``: whole, counted, bounded.

granian hands a body as chunks that each say ``more_body: True`` and only then an empty closing message;
every ``receive`` is a hand-off between granian's thread and the event loop. A declared body is whole once
its last declared byte has arrived (hyper delivers none past it), so it is taken without that last hand-off.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import pytest

from sessionmem_core.env import ServingLimits
from sessionmem_core.errors import InvalidRequest, PayloadTooLarge
from sessionmem_proxy.limits import BodyMeter, RequestLimits


class Granian:
    """Gives the messages granian would, in order, and counts how many the app asked for."""

    def __init__(self, *chunks: bytes, disconnect: bool = False) -> None:
        self.messages: list[MutableMapping[str, Any]] = [
            {"type": "http.request", "body": chunk, "more_body": True} for chunk in chunks
        ]
        self.messages.append({"type": "http.disconnect"} if disconnect else {"type": "http.request", "body": b""})
        self.asked = 0

    async def receive(self) -> MutableMapping[str, Any]:
        self.asked += 1
        return self.messages[self.asked - 1]


LIMITS = RequestLimits(ServingLimits(max_body_bytes=1024))


async def test_a_declared_body_is_taken_once_its_last_byte_arrives() -> None:
    granian = Granian(b'{"entries":', b"[]}")
    meter = BodyMeter()
    assert await LIMITS.read_body(granian.receive, "14", meter) == b'{"entries":[]}'
    assert (granian.asked, meter.received) == (2, 14)  # not waiting for the closing empty message


async def test_a_body_without_a_declared_length_is_read_to_its_end() -> None:
    granian = Granian(b"ab", b"cd")
    assert await LIMITS.read_body(granian.receive, None, BodyMeter()) == b"abcd"
    assert granian.asked == 3


async def test_a_declared_body_that_stops_short_is_refused() -> None:
    granian = Granian(b"abc", disconnect=True)
    with pytest.raises(InvalidRequest):
        await LIMITS.read_body(granian.receive, "10", BodyMeter())


async def test_a_body_over_its_declared_length_limit_is_refused_and_counted() -> None:
    granian = Granian(b"x" * 600, b"x" * 600)
    meter = BodyMeter()
    with pytest.raises(PayloadTooLarge):
        await LIMITS.read_body(granian.receive, "1200", meter)
    assert meter.received == 1200
