"""Rolling summaries, off the request path.

When an append leaves a conversation holding more than the threshold, the launcher schedules a
compaction in the background (never on the request that crossed it): it exports the conversation,
asks the summariser to fold everything older than the replay window (and the previous summary) into
one text, and replaces the history with that summary followed by the window, conditional on the
version it read. A conflict means new turns arrived: the next append schedules it again.

Summaries apply to private (session and per-user) memory: a replace re-stamps the author, which in a
shared scratchpad would erase who wrote what.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

import orjson

from sessionmem_core import api
from sessionmem_core.env import LauncherSettings
from sessionmem_core.errors import SessionMemError
from sessionmem_core.keys import ConversationId
from sessionmem_infra.http_client import HttpClient
from sessionmem_launcher.forward import CallerHeaders, Forwarder

_LOG = logging.getLogger("sessionmem.launcher.summary")
_BUILTIN_MAX_CHARS = 4000


class Summarizer(Protocol):
    async def summarize(self, previous: str | None, messages: Sequence[dict[str, Any]]) -> str: ...


class BuiltinSummarizer:
    """Keeps what the user stated, oldest first, within a bound: trivial, but facts from early turns
    survive. Real deployments point SESSIONMEM_SUMMARIZER_URL at a model-backed endpoint."""

    async def summarize(self, previous: str | None, messages: Sequence[dict[str, Any]]) -> str:
        said = [str(m["content"]).strip().replace("\n", " ")[:200] for m in messages if m.get("role") == "user"]
        parts = ([previous] if previous else []) + [f"the user said: {s}" for s in said if s]
        return "; ".join(parts)[:_BUILTIN_MAX_CHARS]


class HttpSummarizer:
    """POST {"previousSummary", "entries": [{role, content}]} -> {"summary": "..."} on the agent side."""

    def __init__(self, url: str, timeout_seconds: float = 60.0) -> None:
        parts = urlsplit(url)
        self._http = HttpClient(f"{parts.scheme}://{parts.netloc}", timeout=timeout_seconds)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    async def summarize(self, previous: str | None, messages: Sequence[dict[str, Any]]) -> str:
        body = orjson.dumps({"previousSummary": previous, "entries": list(messages)})
        response = await self._http.request("POST", self._target, [(b"content-type", b"application/json")], body)
        if response.status != 200:
            raise ValueError(f"summariser answered HTTP {response.status}")
        summary = orjson.loads(response.body).get("summary")
        if not isinstance(summary, str) or not summary:
            raise ValueError("summariser answered without a 'summary' string")
        return summary

    async def aclose(self) -> None:
        await self._http.aclose()


def summarizer_from_settings(settings: LauncherSettings) -> Summarizer:
    return BuiltinSummarizer() if settings.summarizer_url == "builtin" else HttpSummarizer(settings.summarizer_url)


class Compactor:
    def __init__(self, settings: LauncherSettings, memory: Forwarder, summarizer: Summarizer) -> None:
        self._settings = settings
        self._memory = memory
        self._summarizer = summarizer
        self._running: dict[tuple[ConversationId, str | None], asyncio.Task[None]] = {}

    @property
    def enabled(self) -> bool:
        return self._settings.summary_threshold > 0 and self._settings.scope == "session"

    def after_append(self, conversation: ConversationId, length: int, caller: CallerHeaders) -> None:
        if not self.enabled or length <= self._settings.summary_threshold:
            return
        slot = (conversation, caller.capability)
        if slot in self._running:
            return
        # Off the turn's trace: the compaction outlives the request, and only the user's capability carries over.
        task = asyncio.create_task(self._compact(conversation, CallerHeaders(capability=caller.capability)))
        self._running[slot] = task
        task.add_done_callback(lambda _: self._running.pop(slot, None))

    async def idle(self) -> None:
        """Wait for the compactions under way (tests, and a graceful stop)."""
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def _compact(self, conversation: ConversationId, caller: CallerHeaders) -> None:
        try:
            with self._memory.tracer.span("summarize", conversation, None) as span:
                stored = await self._memory.export(conversation, caller)
                if stored.status != 200:
                    span.fail(f"http_{stored.status}")
                    return
                history = orjson.loads(stored.body)
                entries: list[dict[str, Any]] = history["entries"]
                keep = _window_start(entries, self._settings.replay_messages)
                older, window = entries[:keep], entries[keep:]
                previous = None
                if older and str(older[0]["id"]).startswith(api.SUMMARY_ID_PREFIX):
                    previous, older = str(older[0]["content"]), older[1:]
                if not older:
                    return
                text = await self._summarizer.summarize(
                    previous, [{"role": e["role"], "content": e["content"]} for e in older]
                )
                version = int(history["version"])
                seed = [{"role": "system", "content": text, "id": f"{api.SUMMARY_ID_PREFIX}{version}"}]
                seed += [{"role": e["role"], "content": e["content"], "id": e["id"]} for e in window]
                replaced = await self._memory.replace(
                    conversation,
                    orjson.dumps({"entries": seed}),
                    CallerHeaders(capability=caller.capability, if_match=str(version)),
                )
                span.entries, span.version = len(seed), replaced.version
                if replaced.status != 200:
                    span.fail(f"http_{replaced.status}")
        except (SessionMemError, OSError, TimeoutError, ValueError, KeyError) as exc:
            # Best-effort: the history is intact, and the next append past the threshold retries.
            _LOG.warning("summary of %s failed: %s", conversation, exc)


def _window_start(entries: Sequence[dict[str, Any]], window: int) -> int:
    """Index where the replay window starts, moved back to the start of an exchange so none is split."""
    start = max(0, len(entries) - window)
    while start > 0 and entries[start].get("role") != "user":
        start -= 1
    return start
