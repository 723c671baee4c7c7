"""The hot path's own query parsing (``api.parse_query``, the launcher's and the proxy's) must read every
query string exactly as ``parse_qsl`` does."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from sessionmem_core import api


@pytest.mark.parametrize(
    "query",
    [b"", b"limit=40", b"limit=40&scope=shared", b"a&b=&c=1", b"x=1&x=2", b"&&limit=3&", b"redact=a%2Cb", b"q=a+b"],
)
def test_query_params_read_like_parse_qsl(query: bytes) -> None:
    assert dict(api.parse_query(query)) == dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True))
    assert api.parse_query(query) == parse_qsl(query.decode("latin-1"), keep_blank_values=True)
