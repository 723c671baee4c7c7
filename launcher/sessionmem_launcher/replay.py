"""What the managed loop replays: the rolling summary first, then the newest turns, by message count
and, when a token budget is set, only the newest whole exchanges that fit in it."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from typing import Any

SUMMARY_PREFIX = "Relevant memory: "
# Per message, for the role and the separators a chat template adds around it.
_MESSAGE_OVERHEAD = 4
_TOKEN = re.compile(r"\w+|[^\w\s]")

# The roles the managed loop replays to its agent: a clean exchange's (``wire.Role``). Entries a
# framework session wrote into the same conversation with any other role (tool calls and their outputs,
# reasoning, developer messages, ...) are not replayed: the agent behind the loop expects chat text.
REPLAYED_ROLES = frozenset({"user", "assistant", "system"})
TokenCounter = Callable[[str], int]
Message = dict[str, Any]


def approx_tokens(text: str) -> int:
    """Words and punctuation marks: close enough to BPE counts for budgeting, and needs no model."""
    return len(_TOKEN.findall(text))


def load_counter(spec: str) -> TokenCounter:
    """``approx`` or ``package.module:function`` (a callable from text to a token count)."""
    if spec == "approx":
        return approx_tokens
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise ValueError(f"token counter {spec!r} must be 'approx' or 'module:function'")
    counter = getattr(importlib.import_module(module_name), attribute)
    if not callable(counter):
        raise ValueError(f"token counter {spec!r} is not callable")
    return counter  # type: ignore[no-any-return]


def message_cost(message: Message, counter: TokenCounter) -> int:
    return counter(str(message.get("content", ""))) + _MESSAGE_OVERHEAD


def exchanges(messages: Sequence[Message]) -> list[list[Message]]:
    """Groups that must be replayed whole: a user message with the answers that follow it."""
    groups: list[list[Message]] = []
    for message in messages:
        if message.get("role") == "user" or not groups:
            groups.append([message])
        else:
            groups[-1].append(message)
    return groups


def within_budget(
    summary: Message | None, messages: Sequence[Message], budget: int | None, counter: TokenCounter
) -> list[Message]:
    """The summary (if it fits) and the newest whole exchanges that fit after it, oldest first."""
    if budget is None:
        return ([summary] if summary else []) + list(messages)
    remaining = budget
    head: list[Message] = []
    if summary is not None and message_cost(summary, counter) <= remaining:
        head = [summary]
        remaining -= message_cost(summary, counter)
    chosen: list[list[Message]] = []
    for group in reversed(exchanges(messages)):
        cost = sum(message_cost(m, counter) for m in group)
        if cost > remaining:
            break
        chosen.append(group)
        remaining -= cost
    return head + [m for group in reversed(chosen) for m in group]


def history_from(body: dict[str, Any]) -> tuple[Message | None, list[Message]]:
    """(summary as a system message, window of ``{"role", "content", "author"}``) from a read response:
    its entries of the ``REPLAYED_ROLES`` with text, as text (an entry's ``item`` is not replayed)."""
    # Every entry keeps its author (system ones included): in a shared conversation a member must know
    # which agent said what, and an instruction another member wrote must not pass for the agent's own.
    window = [
        {"role": e["role"], "content": e["content"], "author": e.get("author")}
        for e in body.get("entries", [])
        if e["role"] in REPLAYED_ROLES and e["content"]
    ]
    raw = body.get("summary")
    summary = {"role": "system", "content": SUMMARY_PREFIX + str(raw["content"])} if raw else None
    return summary, window
