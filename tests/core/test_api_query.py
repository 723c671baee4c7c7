"""The hot path's own query parsing (``api.parse_query``, the launcher's and the proxy's) must read every
query string exactly as ``parse_qsl`` does."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from sessionmem_core import api


@pytest.mark.parametrize(
    "query",
    ["", "limit=40", "limit=40&scope=shared", "a&b=&c=1", "x=1&x=2", "&&limit=3&", "redact=a%2Cb", "q=a+b", "a=é€"],
)
def test_query_params_read_like_parse_qsl(query: str) -> None:
    assert dict(api.parse_query(query)) == dict(parse_qsl(query, keep_blank_values=True))
    assert api.parse_query(query) == parse_qsl(query, keep_blank_values=True)
