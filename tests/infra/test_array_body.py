"""A JSON answer built around stored values without decoding them (``serving.array_body``)."""

from __future__ import annotations

import orjson
import pytest

from sessionmem_infra.serving import array_body

HEAD = b'{"conversationId":"c1","entries":['
TAIL = b'],"nextOffset":null}'


@pytest.mark.parametrize(
    "items",
    [
        [],
        [b'{"id":"a"}'],
        [b'{"id":"a"}', b'{"id":"b","item":{"k":[1,2]}}', b'{"id":"c"}'],
        [b'{"id":"big","content":"' + b"x" * (1 << 20) + b'"}'] * 3,
    ],
    ids=["none", "one", "three", "three-big"],
)
def test_the_items_are_the_array_in_order_and_byte_for_byte(items: list[bytes]) -> None:
    body = array_body(HEAD, items, TAIL)
    assert body == HEAD + b",".join(items) + TAIL
    document = orjson.loads(body)
    assert [orjson.dumps(entry) for entry in document["entries"]] == [orjson.dumps(orjson.loads(i)) for i in items]
    assert document["nextOffset"] is None


def test_the_items_list_is_left_as_it_was() -> None:
    items = [b"1", b"2"]
    array_body(b"[", items, b"]")
    assert items == [b"1", b"2"]
