"""Redaction on RE2: the same text redacted as the backtracking patterns it replaced, in time linear in the
input (a correctness bound against quadratic blow-up, not a benchmark), custom patterns RE2 cannot run
refused at start, and a large batch redacted off the event loop."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionmem_core.env import ConfigError
from sessionmem_proxy.redaction import OFF_LOOP_CHARS, Redaction, Redactor, luhn_ok

# The backtracking patterns redaction used before RE2, kept here as the reference of what is redacted
# (the Luhn check is not what changed: the reference uses the module's own).
_OLD_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_OLD_PHONE = re.compile(r"(?<![\w+])\+?\d[\d ()./-]{6,}\d(?!\w)")
_OLD_CARD = re.compile(r"(?<!\d)\d(?:[ -]?\d){12,18}(?!\d)")


def old_redact(text: str) -> str:
    text = _OLD_EMAIL.sub("[redacted:email]", text)

    def card(match: re.Match[str]) -> str:
        return "[redacted:card]" if luhn_ok(re.sub(r"\D", "", match.group())) else match.group()

    def phone(match: re.Match[str]) -> str:
        return "[redacted:phone]" if 7 <= len(re.sub(r"\D", "", match.group())) <= 15 else match.group()

    return _OLD_PHONE.sub(phone, _OLD_CARD.sub(card, text))


_CHAIN = Redaction().chain(["email", "card", "phone"])
assert _CHAIN is not None
REDACT_ALL: Redactor = _CHAIN

# Text made of the pieces the patterns care about, so matches, near-matches and boundaries are common.
_PIECES = st.sampled_from(
    ["a", "Z", "_", "é", "@", ".", "-", "+", " ", "(", ")", "/", "1", "4", "9", "٣", "x.y", "ab@cd.ef", "\n", "%"]
)
_TEXT = st.lists(_PIECES, max_size=60).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXT)
def test_redacts_exactly_what_the_backtracking_patterns_did(text: str) -> None:
    assert REDACT_ALL(text) == old_redact(text)


@pytest.mark.parametrize(
    "text",
    [
        "mail ada@example.com or +1 (555) 123-4567, card 4111 1111 1111 1111",
        "call 555-123-4567. then 555.123.4567",
        "x5551234567 a+5551234567 b",
        "12345678901234567890123",
        "٥٥٥١٢٣٤٥٦٧ x",
        "é ada.l@ex-ample.co.uk é",
        "4111111111111111 4111111111111112",
    ],
)
def test_known_cases_match_the_reference(text: str) -> None:
    assert REDACT_ALL(text) == old_redact(text)


_KIB = 1024
_PATHOLOGICAL = st.sampled_from(["a@a.", "a", "1", "1 ", "a@", "a.", "+1", "1-", "@a.a"])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_PATHOLOGICAL, _PATHOLOGICAL)
def test_pathological_input_is_redacted_in_bounded_time_per_kib(unit: str, tail: str) -> None:
    size = 256 * _KIB
    text = (unit * (size // len(unit) + 1))[:size] + tail
    started = time.process_time()
    REDACT_ALL(text)
    # A generous bound, far above linear (~0.2 s here) and far below quadratic (tens of seconds).
    assert time.process_time() - started < 1.0


def test_custom_patterns_run_on_re2_and_unrunnable_ones_are_refused_at_start() -> None:
    custom = Redaction.from_json('{"employee-id": "EMP-[0-9]{6}"}').chain(["employee-id"])
    assert custom is not None and custom("id EMP-123456 ok") == "id [redacted:employee-id] ok"
    for pattern in (r"(a)\1", r"(?<=x)y", r"a(?!b)"):
        with pytest.raises(ConfigError, match="bad"):
            Redaction.from_json(orjson.dumps({"bad": pattern}).decode())
    with pytest.raises(ConfigError, match="built in"):
        Redaction({"email": "x"})


async def test_a_large_batch_is_redacted_off_the_event_loop() -> None:
    threads: list[str] = []

    def record(text: str) -> str:
        threads.append(threading.current_thread().name)
        return text.upper()

    small, _cpu = await Redaction.apply(record, ["a" * 10])
    large, _cpu = await Redaction.apply(record, ["b" * OFF_LOOP_CHARS, "c"])
    assert small == ["A" * 10] and large == ["B" * OFF_LOOP_CHARS, "C"]
    assert threads[0] == threading.current_thread().name
    assert threads[1] == threads[2] != threading.current_thread().name
    await asyncio.sleep(0)
