"""What the tests of several components send: a {user, assistant} exchange, and every class of bad
conversation id the rule (core/sessionmem_core/keys.py) rejects, as it appears in a URL path."""

from __future__ import annotations

from urllib.parse import quote

BAD_IDS = {
    "empty": "",
    "129 characters": "x" * 129,
    "slash": "a/b",
    "colon": "a:b",
    "space": quote("a b"),
    "tab": quote("a\tb"),
    "newline": quote("a\nb"),
    "control character": quote("a\x01b"),
    "DEL": quote("a\x7fb"),
    "dot segment": "%2E%2E",
}
# Refused as a path (a segment that climbs) before any id is read from it (sessionmem_infra.serving.check_path).
_REFUSED_AS_PATH = frozenset({BAD_IDS["dot segment"]})


def bad_id_error(bad_id: str) -> str:
    """The error type a server answers for ``bad_id`` in a request path."""
    return "malformed_request" if bad_id in _REFUSED_AS_PATH else "invalid_conversation_id"


def exchange(turn: str, user: str = "hi", assistant: str = "hello") -> dict[str, object]:
    return {
        "entries": [
            {"role": "user", "content": user, "id": f"{turn}-u"},
            {"role": "assistant", "content": assistant, "id": f"{turn}-a"},
        ]
    }
