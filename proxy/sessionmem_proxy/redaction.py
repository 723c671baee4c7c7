"""Redaction before persistence: personal data an agent opts out of storing never reaches Valkey.

Named redactors only: the built-in ones below plus patterns the operator of the proxy configures
(``SESSIONMEM_REDACT_PATTERNS``, a JSON object of name -> regex). An agent opts in by name (the
launcher sends ``redact=email,phone,...`` from its pod configuration); it can never send a regex, so no
caller-supplied pattern runs on the proxy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

import orjson

from sessionmem_core.api import BUILTIN_REDACTORS
from sessionmem_core.errors import InvalidRequest

Redactor = Callable[[str], str]

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_PHONE = re.compile(r"(?<![\w+])\+?\d[\d ()./-]{6,}\d(?!\w)")
_CARD = re.compile(r"(?<!\d)\d(?:[ -]?\d){12,18}(?!\d)")


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _redact_cards(text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        digits = re.sub(r"\D", "", match.group())
        return "[redacted:card]" if _luhn_ok(digits) else match.group()

    return _CARD.sub(replace, text)


def _redact_phones(text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        digits = re.sub(r"\D", "", match.group())
        return "[redacted:phone]" if 7 <= len(digits) <= 15 else match.group()

    return _PHONE.sub(replace, text)


def _pattern(name: str, regex: re.Pattern[str]) -> Redactor:
    return lambda text: regex.sub(f"[redacted:{name}]", text)


BUILTIN: dict[str, Redactor] = {
    "email": _pattern("email", _EMAIL),
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
                raise ValueError(f"redactor {name!r} is built in")
            self._redactors[name] = _pattern(name, re.compile(regex))

    @classmethod
    def from_json(cls, patterns_json: str | None) -> Redaction:
        if not patterns_json:
            return cls()
        patterns = orjson.loads(patterns_json)
        if not isinstance(patterns, dict) or not all(isinstance(v, str) for v in patterns.values()):
            raise ValueError("SESSIONMEM_REDACT_PATTERNS must be a JSON object of name -> regex")
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
