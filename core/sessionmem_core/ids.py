r"""The identifier rules: conversation ids, message ids, Kubernetes names.

A conversation id becomes part of a Valkey key and of a URL path, so this is the key/path-injection
guard: non-empty, at most 128 characters, none of ``/``, ``:``, ``"``, ``\``, whitespace or control
characters, nor U+FFFD, and not ``.`` or ``..`` (URL dot segments, which clients rewrite). Quotes and
backslashes are refused because ids are written into stored JSON as they are. U+FFFD is what the HTTP
server puts where a path's percent-escapes were not UTF-8 (``%FF``, an overlong ``%C0%AF``): an id holding
it could not be told from bytes that were never text, so it is refused rather than becoming another
conversation. No Unicode normalisation: NFC and NFD forms are two ids.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
from typing import NewType

from sessionmem_core.errors import InvalidConversationId, InvalidMessageId, InvalidRequest

MAX_ID_LENGTH = 128

# Rejected anywhere in an id: the key separators, every Unicode whitespace and every control
# character (C0, DEL, C1), and U+FFFD. \s covers the Unicode whitespace set in Python's re.
_FORBIDDEN = re.compile(r'[/:"\\\s\x00-\x1f\x7f-\x9f\ufffd]')


def _id_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > MAX_ID_LENGTH:
        return f"must be at most {MAX_ID_LENGTH} characters (got {len(value)})"
    bad = _FORBIDDEN.search(value)
    if bad is not None:
        return (
            f"must not contain {bad.group()!r} ('/', ':', '\"', '\\', whitespace and control characters "
            "and U+FFFD are not allowed)"
        )
    if value in (".", ".."):
        # URL dot segments: HTTP clients normalise them away, so such an id could never be addressed.
        return "must not be '.' or '..'"
    return None


# A conversation id that passed the rule: what keys, paths and spans are built from. Each process parses
# the id it receives once (``parse_conversation_id``) and hands this on; code that needs an id takes this
# type, so mypy refuses a raw string there. A ``str`` at run time: no copy, no wrapper on the hot path.
ConversationId = NewType("ConversationId", str)


def parse_conversation_id(value: str) -> ConversationId:
    """The id, checked (typed 400 ``invalid_conversation_id`` otherwise)."""
    problem = _id_problem(value)
    if problem is not None:
        raise InvalidConversationId(f"conversationId {problem}")
    return ConversationId(value)


def validate_conversation_id(value: str) -> str:
    return parse_conversation_id(value)


def validate_message_id(value: str) -> str:
    problem = _id_problem(value)
    if problem is not None:
        raise InvalidMessageId(f"message id {problem}")
    return value


def is_valid_id(value: str) -> bool:
    return _id_problem(value) is None


def new_conversation_id() -> str:
    """A random opaque conversation id that satisfies the rule (URL-safe, 22 characters)."""
    return secrets.token_urlsafe(16)


# Minted message ids, drawn from the OS's random source a batch at a time (one system call per batch
# instead of per id). Unpredictable on purpose: a member of a shared conversation who could guess the
# ids the proxy will mint could store them first and have another member's entries dropped as retries.
_MESSAGE_ID_BYTES = 12
_MINT_BATCH = 256
_minted: list[str] = []
# A forked worker must not hand out the ids its parent already drew.
os.register_at_fork(after_in_child=_minted.clear)


def new_message_id() -> str:
    """A random message id (16 URL-safe characters, 96 bits). ``list.pop`` is atomic, so threads may
    share the batch."""
    try:
        return _minted.pop()
    except IndexError:
        width = _MESSAGE_ID_BYTES * 4 // 3
        batch = base64.urlsafe_b64encode(os.urandom(_MESSAGE_ID_BYTES * _MINT_BATCH)).decode()
        _minted.extend(batch[i : i + width] for i in range(0, len(batch), width))
        return _minted.pop()


# RFC 1123 label: what Kubernetes accepts for namespaces and most object names.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63


def validate_dns_label(value: str, what: str) -> str:
    if len(value) > DNS_LABEL_MAX or not _DNS_LABEL.match(value):
        raise InvalidRequest(f"{what} {value!r} is not a valid DNS-1123 label")
    return value
