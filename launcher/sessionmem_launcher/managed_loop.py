"""The managed loop: the agent's serving port. A turn that carries ``X-Conversation-Id`` gets the last
turns replayed to the agent and its {user, assistant} exchange appended after the final answer.

Memory is best-effort for the turn (fail-open): when it cannot be read the agent answers without
context, and when the exchange cannot be stored the answer still goes out; the
``X-Sessionmem-Memory`` header says which happened. Without the header the turn is single-shot.

Agent protocol (any language): the launcher POSTs the caller's JSON body to the agent on 127.0.0.1
with ``history`` added (a list of ``{"role", "content"}``, oldest first); the agent answers JSON with
an ``output`` string, which is passed back to the caller as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from sessionmem_core import api, env
from sessionmem_core.env import LauncherSettings
from sessionmem_core.errors import InvalidRequest, SessionMemError
from sessionmem_core.http_client import HttpClient
from sessionmem_core.ids import new_message_id, validate_conversation_id
from sessionmem_core.telemetry import MemoryTracer
from sessionmem_launcher.asgi import header, read_body, respond, respond_error
from sessionmem_launcher.memory_client import MemoryClient
from sessionmem_launcher.replay import history_from, load_counter, within_budget
from sessionmem_launcher.summary import Compactor, summarizer_from_settings

if TYPE_CHECKING:  # the launcher does not import Starlette at run time
    from starlette.types import Receive, Scope, Send

# Hop-by-hop and identity headers are not relayed to the agent.
_NOT_RELAYED = {b"host", b"content-length", b"connection", b"transfer-encoding", b"keep-alive", b"upgrade"}


class AgentUnavailable(SessionMemError):
    error_type = "agent_unavailable"
    status = 502


class ManagedLoop:
    def __init__(
        self,
        settings: LauncherSettings,
        client: MemoryClient,
        tracer: MemoryTracer,
        compactor: Compactor | None = None,
    ) -> None:
        self._settings = settings
        self._memory = client
        self._tracer = tracer
        self._count_tokens = load_counter(settings.token_counter)
        self.compactor = compactor or Compactor(settings, client, summarizer_from_settings(settings), tracer)
        self._agent = HttpClient(f"http://127.0.0.1:{settings.agent_port}", timeout=settings.agent_timeout_seconds)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            if scope["path"] == "/healthz" and scope["method"] == "GET":
                await respond(send, 200, b'{"status":"ok"}')
                return
            body = await read_body(receive, env.MAX_BODY_BYTES)
            conversation_id = header(scope["headers"], api.CONVERSATION_ID_HEADER.encode())
            if conversation_id is None:
                status, headers, answer = await self._call_agent(scope, body)
                await respond(send, status, answer, headers)
                return
            await self._turn(scope, send, validate_conversation_id(conversation_id), body)
        except SessionMemError as exc:
            await respond_error(send, exc)

    async def _turn(self, scope: Scope, send: Send, conversation_id: str, body: bytes) -> None:
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest("a turn with X-Conversation-Id must be a JSON object") from exc
        if not isinstance(request, dict) or not isinstance(request.get("input"), str):
            raise InvalidRequest("a turn with X-Conversation-Id needs a string field 'input'")
        headers = scope["headers"]
        traceparent = header(headers, b"traceparent")
        capability = header(headers, api.USER_CAPABILITY_HEADER.encode())

        memory_status = "ok"
        history = await self._replay(conversation_id, capability, traceparent)
        if history is None:
            memory_status, history = "unavailable", []
        request["history"] = history
        status, agent_headers, answer = await self._call_agent(scope, orjson.dumps(request))
        output = _output_of(answer) if 200 <= status < 300 else None
        if output is not None:
            stored = await self._store(conversation_id, request["input"], output, capability, traceparent)
            if not stored and memory_status == "ok":
                memory_status = "not-stored"
        elif memory_status == "ok":
            memory_status = "not-stored"
        await respond(
            send, status, answer, [*agent_headers, (api.MEMORY_STATUS_HEADER.encode(), memory_status.encode())]
        )

    async def _replay(
        self, conversation_id: str, capability: str | None, traceparent: str | None
    ) -> list[dict[str, object]] | None:
        """The last turns as the agent sees them, or None when memory is unavailable."""
        query = [(api.LIMIT_PARAM, str(self._settings.replay_messages)), ("summary", "true")]
        try:
            with self._tracer.span("get", conversation_id, traceparent) as span:
                response = await self._memory.call(
                    "GET",
                    api.entries_path(conversation_id),
                    query,
                    None,
                    capability=capability,
                    traceparent=traceparent,
                )
                span.scope, span.entries, span.version = response.scope, response.entries, response.version
                if response.status != 200:
                    span.fail(f"http_{response.status}")
                    return None
        except SessionMemError:
            return None
        try:
            summary, window = history_from(orjson.loads(response.body))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None  # an unreadable history is memory unavailable: the turn goes on without it
        return within_budget(summary, window, self._settings.replay_tokens, self._count_tokens)

    async def _store(
        self, conversation_id: str, user: str, assistant: str, capability: str | None, traceparent: str | None
    ) -> bool:
        turn = new_message_id()
        body = orjson.dumps(
            {
                "entries": [
                    {"role": "user", "content": user, "id": f"{turn}-u"},
                    {"role": "assistant", "content": assistant, "id": f"{turn}-a"},
                ]
            }
        )
        try:
            with self._tracer.span("append", conversation_id, traceparent) as span:
                response = await self._memory.call(
                    "POST", api.entries_path(conversation_id), [], body, capability=capability, traceparent=traceparent
                )
                span.scope, span.entries, span.version = response.scope, response.entries, response.version
                if response.status != 200:
                    span.fail(f"http_{response.status}")
                    return False
        except SessionMemError:
            return False
        self.compactor.after_append(conversation_id, int(orjson.loads(response.body).get("length", 0)), capability)
        return True

    async def _call_agent(self, scope: Scope, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        relayed = [(k, v) for k, v in scope["headers"] if k not in _NOT_RELAYED]
        query = scope["query_string"].decode("latin-1")
        target = scope.get("raw_path") or scope["path"].encode()
        url = (target.decode("latin-1") if isinstance(target, bytes) else str(target)) + (f"?{query}" if query else "")
        try:
            response = await self._agent.request(scope["method"], url, relayed, body)
        except OSError as exc:  # HttpTimeout and TimeoutError are OSErrors too
            raise AgentUnavailable(
                f"agent on port {self._settings.agent_port} unreachable: {type(exc).__name__}"
            ) from exc
        headers = [(k, v) for k, v in response.headers if k not in _NOT_RELAYED]
        return response.status, headers, response.body

    async def aclose(self) -> None:
        await self.compactor.idle()
        await self._agent.aclose()


def _output_of(answer: bytes) -> str | None:
    try:
        parsed = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    output = parsed.get("output") if isinstance(parsed, dict) else None
    return output if isinstance(output, str) else None
