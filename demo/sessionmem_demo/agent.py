"""A tiny rule-based agent that speaks the managed loop's protocol: it gets ``input`` and ``history``
and answers ``output``. It remembers nothing itself, so whatever it recalls came from sessionmem."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

# ASGI's own shapes (the demo needs no web framework: uvicorn serves the app as it is).
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_NAME = re.compile(r"\bmy name is ([A-Za-z][\w-]*)", re.IGNORECASE)


def reply(user_input: str, history: list[dict[str, Any]]) -> str:
    said = _NAME.search(user_input)
    if said:
        return f"Nice to meet you, {said.group(1)}! I'll remember that."
    if "my name" in user_input.lower():
        # The user's own turns, or the rolling summary (a system message) that kept older ones.
        for turn in reversed(history):
            if turn.get("role") in ("user", "system"):
                found = _NAME.search(str(turn.get("content", "")))
                if found:
                    return f"Your name is {found.group(1)}."
        return "I don't know your name yet."
    return f"You said {user_input!r}; I can see {len(history)} earlier messages."


async def read_body(receive: Receive) -> bytes:
    """The whole body of an ASGI request."""
    body = b""
    while True:
        message = await receive()
        body += bytes(message.get("body", b""))
        if not message.get("more_body"):
            return body


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = await read_body(receive)
    try:
        request = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        request = {}
    if not isinstance(request, dict):
        request = {}
    raw_history = request.get("history")
    history: list[dict[str, Any]] = raw_history if isinstance(raw_history, list) else []
    answer = orjson.dumps({"output": reply(str(request.get("input", "")), history), "historySeen": len(history)})
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": answer})
