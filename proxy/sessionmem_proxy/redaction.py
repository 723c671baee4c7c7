"""Redaction before persistence: personal data an agent opts out of storing never reaches Valkey.

Named redactors only: the built-in ones below plus patterns the operator of the proxy configures
(``SESSIONMEM_REDACT_PATTERNS``, a JSON object of name -> regex). An agent opts in by name (the
launcher sends ``redact=email,phone,...`` from its pod configuration); it can never send a regex, so no
caller-supplied pattern runs on the proxy.

Every pattern runs on RE2 (``google-re2``): time linear in the input, whatever the input, so a hostile
turn cannot stall the proxy the way a backtracking engine can (an e-mail pattern over ``a@a.a.a...`` is
quadratic there). Custom patterns RE2 cannot compile (backreferences, lookaround) are refused at start
with a ConfigError naming them. A large batch is redacted in a worker thread (``Redaction.apply``), off
the event loop.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import orjson
import re2

from sessionmem_core.api import BUILTIN_REDACTORS
from sessionmem_core.env import REDACT_PATTERNS, ConfigError
from sessionmem_core.errors import InvalidRequest

Redactor = Callable[[str], str]

# Texts adding up to more characters than this are redacted in a worker thread; under it a pass is cheap
# enough that a thread hop would cost more than it saves.
OFF_LOOP_CHARS: Final = 8 * 1024


def _compile(pattern: bytes) -> Any:
    return re2.compile(pattern)


_EMAIL = _compile(rb"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
# RE2 has no lookaround. Python's ``(?<![\w+])PHONE(?!\w)`` becomes: PHONE preceded by the start or one
# character that is neither a word character nor '+', and followed by the end or a non-word character;
# the phone itself is group 1, and the search resumes right after it (so the character after one match
# can be the one before the next). Leftmost-first semantics make RE2 pick the same span the backtracking
# pattern did. ``\w`` and ``\d`` are Python's Unicode classes: letters, numbers and '_', decimal digits.
_PHONE = _compile(rb"(?:^|[^\p{L}\p{N}_+])(\+?\p{Nd}[\p{Nd} ()./-]{6,}\p{Nd})(?:[^\p{L}\p{N}_]|$)")
_CARD = _compile(rb"(?:^|[^\p{Nd}])(\p{Nd}(?:[ -]?\p{Nd}){12,18})(?:[^\p{Nd}]|$)")
_NOT_DIGIT = re.compile(r"\D")


def luhn_ok(digits: str) -> bool:
    """Whether a card number's digits pass the Luhn checksum (a number that fails is not redacted)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _substitute(regex: Any, text: str, replace: Callable[[str], str | None], group: int = 0) -> str:
    """Every non-overlapping match of ``regex`` (its ``group`` span) through ``replace`` (None keeps it), as
    ``re.sub`` walks them: one UTF-8 encoding of the text, each search starting where the last match
    ended, so the whole pass is linear in the text."""
    data = text.encode()
    pieces: list[bytes] = []
    kept = 0
    pos = 0
    end = len(data)
    while pos <= end:
        match = regex.search(data, pos)
        if match is None:
            break
        start, stop = match.span(group)
        found = data[start:stop].decode()
        replacement = replace(found)
        if replacement is not None:
            pieces.append(data[kept:start])
            pieces.append(replacement.encode())
            kept = stop
        pos = stop if stop > pos else pos + 1
    if not pieces:
        return text
    pieces.append(data[kept:])
    return b"".join(pieces).decode()


def _redact_emails(text: str) -> str:
    return _substitute(_EMAIL, text, lambda _: "[redacted:email]") if "@" in text else text


def _redact_cards(text: str) -> str:
    def replace(found: str) -> str | None:
        return "[redacted:card]" if luhn_ok(_NOT_DIGIT.sub("", found)) else None

    return _substitute(_CARD, text, replace, group=1)


def _redact_phones(text: str) -> str:
    def replace(found: str) -> str | None:
        return "[redacted:phone]" if 7 <= len(_NOT_DIGIT.sub("", found)) <= 15 else None

    return _substitute(_PHONE, text, replace, group=1)


def _pattern(name: str, regex: Any) -> Redactor:
    replacement = f"[redacted:{name}]"
    return lambda text: _substitute(regex, text, lambda _: replacement)


BUILTIN: dict[str, Redactor] = {
    "email": _redact_emails,
    # Cards before phones: a card number would otherwise look like a long phone number.
    "card": _redact_cards,
    "phone": _redact_phones,
}
_ORDER = BUILTIN_REDACTORS


class Redaction:
    def __init__(self, custom: Mapping[str, str] | None = None) -> None:
        self._redactors = dict(BUILTIN)
        for name, regex in (custom or {}).items():
            if name in BUILTIN:
                raise ConfigError(f"{REDACT_PATTERNS}: redactor {name!r} is built in")
            try:
                compiled = re2.compile(regex.encode())
            except re2.error as exc:
                raise ConfigError(
                    f"{REDACT_PATTERNS}: pattern {name!r} ({regex!r}) is not one RE2 runs in linear time: {exc}"
                ) from exc
            self._redactors[name] = _pattern(name, compiled)

    @classmethod
    def from_json(cls, patterns_json: str | None) -> Redaction:
        if not patterns_json:
            return cls()
        patterns = orjson.loads(patterns_json)
        if not isinstance(patterns, dict) or not all(isinstance(v, str) for v in patterns.values()):
            raise ConfigError(f"{REDACT_PATTERNS} must be a JSON object of name -> regex")
        return cls({str(k): v for k, v in patterns.items()})

    def chain(self, names: Iterable[str]) -> Redactor | None:
        """The redactors an agent opted into, applied in a fixed order; None when it opted into none."""
        wanted = [n.strip() for n in names if n.strip()]
        unknown = sorted(set(wanted) - self._redactors.keys())
        if unknown:
            raise InvalidRequest(f"unknown redactor(s) {unknown}; known: {sorted(self._redactors)}")
        if not wanted:
            return None
        ordered = [n for n in _ORDER if n in wanted] + sorted(n for n in set(wanted) if n not in _ORDER)
        steps = [self._redactors[n] for n in ordered]

        def redact(text: str) -> str:
            for step in steps:
                text = step(text)
            return text

        return redact

    @staticmethod
    async def apply(redactor: Redactor, texts: Sequence[str]) -> list[str]:
        """``redactor`` over ``texts``: in a worker thread when they add up to more than ``OFF_LOOP_CHARS``
        (long enough to hold up the event loop), inline otherwise."""
        if sum(len(text) for text in texts) <= OFF_LOOP_CHARS:
            return [redactor(text) for text in texts]
        return await asyncio.to_thread(lambda: [redactor(text) for text in texts])


def strings_of(value: Any, into: list[str]) -> list[str]:
    """Every string value inside a JSON value (an entry's item), depth first in document order, appended
    to ``into``: what redaction walks besides an entry's content. Keys are the item's structure and are
    kept as they are."""
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, dict):
        for inner in value.values():
            strings_of(inner, into)
    elif isinstance(value, list):
        for inner in value:
            strings_of(inner, into)
    return into


def with_strings(value: Any, replacements: Iterator[str]) -> Any:
    """``value`` with its string values replaced, in ``strings_of``'s order, by ``replacements``; keys,
    their order and every other value kept."""
    if isinstance(value, str):
        return next(replacements)
    if isinstance(value, dict):
        return {key: with_strings(inner, replacements) for key, inner in value.items()}
    if isinstance(value, list):
        return [with_strings(inner, replacements) for inner in value]
    return value
