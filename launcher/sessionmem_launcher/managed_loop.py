"""The managed loop: the agent's serving port. A turn that carries ``X-Conversation-Id`` gets the last
turns replayed to the agent and its {user, assistant} exchange appended after the final answer.

Memory is best-effort for the turn (fail-open): when it cannot be read the agent answers without
context, and when the exchange cannot be stored the answer still goes out; the
``X-Sessionmem-Memory`` header says which happened. Without the header the turn is single-shot.

Agent protocol (any language): the launcher POSTs the caller's JSON body to the agent on 127.0.0.1
with ``history`` added (a list of ``{"role", "content", "author"}``, oldest first); the agent answers JSON with
an ``output`` string, which is passed back to the caller as it is.

The caller's ``X-Sessionmem-User-Capability`` stays in the launcher: a request that carries one (a turn or
a single-shot request alike) reaches the agent with an ``X-Sessionmem-Turn`` handle instead, live until
the agent's answer is in (``sessionmem_launcher.turns``). The launcher's own replay and append use the
capability itself.
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote

import orjson
from granian.rsgi import HTTPProtocol, Scope

from sessionmem_core import api
from sessionmem_core.env import LauncherSettings
from sessionmem_core.errors import InvalidRequest, SessionMemError
from sessionmem_core.keys import ConversationId, new_message_id, parse_conversation_id
from sessionmem_infra.http_client import HttpClient
from sessionmem_infra.serving import respond
from sessionmem_launcher.forward import CallerHeaders, Forwarder
from sessionmem_launcher.replay import history_from, load_counter, within_budget
from sessionmem_launcher.serving import HEALTH_PATH, HEALTHY, Admission, ListenerLimits
from sessionmem_launcher.summary import Compactor, summarizer_from_settings
from sessionmem_launcher.turns import TurnBindings

# The request headers relayed to the agent: an allow-list. The user's signed capability is bound to the turn
# by the launcher and never reaches the agent process (a handle does); neither do credentials, identity
# headers or a turn handle a caller sends, nor hop-by-hop headers.
AGENT_REQUEST_HEADERS = frozenset(
    {
        "content-type",
        "accept",
        "accept-language",
        "user-agent",
        api.TRACEPARENT_HEADER,
        "tracestate",
        "baggage",
        "x-request-id",
        api.CONVERSATION_ID_HEADER,
    }
)
# The agent's answer goes back with its headers but the hop-by-hop ones (and the length and date, which the
# launcher's server sets for the answer it sends).
_NOT_RETURNED = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "upgrade", "content-length", "date", "server"}
)

_TURN = api.TURN_HEADER.encode()

# Characters a path keeps unescaped when the decoded path is sent on to the agent.
_PATH_SAFE = "/!$&'()*+,;=:@~"


class AgentUnavailable(SessionMemError):
    error_type = "agent_unavailable"
    status = 502


READY = b'{"status":"ready"}'
# How often the readiness answer tries the agent's port while it waits for it.
_READY_RETRY_SECONDS = 0.05


class ManagedLoop:
    def __init__(
        self,
        settings: LauncherSettings,
        forwarder: Forwarder,
        limits: ListenerLimits,
        turns: TurnBindings,
        compactor: Compactor | None = None,
    ) -> None:
        self._settings = settings
        self._forwarder = forwarder
        self._limits = limits
        self._turns = turns
        self._count_tokens = load_counter(settings.token_counter)
        self.compactor = compactor or Compactor(settings, forwarder, summarizer_from_settings(settings))
        self._agent = HttpClient(f"http://127.0.0.1:{settings.agent_port}", timeout=settings.agent_timeout_seconds)
        self._replay_query = ((api.LIMIT_PARAM, str(settings.replay_messages)), ("summary", "true"))
        # The one wait for the agent's port that readiness probes share (None: none under way).
        self._agent_wait: asyncio.Future[bool] | None = None
        # The pod's one wait for the proxy to answer, started by its first readiness probe (None: not yet).
        self._memory_reach: asyncio.Future[bool] | None = None

    async def __rsgi__(self, scope: Scope, proto: HTTPProtocol) -> None:
        await self._limits.serve(scope, proto, self._serve)

    async def _serve(self, scope: Scope, proto: HTTPProtocol, admission: Admission) -> None:
        body = await admission.body()  # every request of the serving port is counted, probes included
        if scope.path == HEALTH_PATH and scope.method == "GET":
            respond(proto, 200, HEALTHY)
            return
        if scope.path == api.AGENT_READY_PATH and scope.method == "GET":
            await self._ready()
            respond(proto, 200, READY)
            return
        capability = scope.headers.get(api.USER_CAPABILITY_HEADER)
        conversation_id = scope.headers.get(api.CONVERSATION_ID_HEADER)
        if conversation_id is None:
            status, headers, answer = await self._call_agent(scope, body, capability)
            proto.response_bytes(status, headers, answer)
            return
        await self._turn(scope, proto, parse_conversation_id(conversation_id), body, capability)

    async def _ready(self) -> None:
        """Returns once the pod may take turns: its agent listens (``_agent_listening``), and, until the
        pod's first ready answer, the proxy answers too, waited for beside the agent within the same
        ``api.AGENT_READY_WAIT_SECONDS``. A pod's address may be refused for its first seconds (a
        NetworkPolicy agent admitting it late), and a cold pod's first turn, held by Knative's activator
        until this answer, would otherwise be answered without memory. Fail-open: a proxy that does not
        answer in time never keeps the pod unready; its turns go on without memory, as when it goes away
        later, and later probes do not wait for it again."""
        if self._memory_reach is None:
            self._memory_reach = asyncio.ensure_future(self._forwarder.reach(api.AGENT_READY_WAIT_SECONDS))
        await self._agent_listening()
        await asyncio.shield(self._memory_reach)

    async def _agent_listening(self) -> None:
        """Returns once the agent accepts a connection on its port, waiting up to
        ``api.AGENT_READY_WAIT_SECONDS`` for it; ``agent_unavailable`` (502) after that. Concurrent probes
        (the kubelet's, queue-proxy's, the activator's) share one wait."""
        if self._agent_wait is None or self._agent_wait.done():
            self._agent_wait = asyncio.ensure_future(self._wait_for_agent())
        if not await asyncio.shield(self._agent_wait):
            raise AgentUnavailable(f"agent on port {self._settings.agent_port} is not listening yet")

    async def _wait_for_agent(self) -> bool:
        try:
            async with asyncio.timeout(api.AGENT_READY_WAIT_SECONDS):
                while True:
                    try:
                        _, writer = await asyncio.open_connection("127.0.0.1", self._settings.agent_port)
                    except OSError:
                        await asyncio.sleep(_READY_RETRY_SECONDS)
                        continue
                    writer.close()
                    return True
        except TimeoutError:
            return False

    async def _turn(
        self, scope: Scope, proto: HTTPProtocol, conversation: ConversationId, body: bytes, capability: str | None
    ) -> None:
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest("a turn with X-Conversation-Id must be a JSON object") from exc
        if not isinstance(request, dict) or not isinstance(request.get("input"), str):
            raise InvalidRequest("a turn with X-Conversation-Id needs a string field 'input'")
        caller = CallerHeaders.of(scope.headers.get, capability)

        memory_status = "ok"
        history = await self._replay(conversation, caller)
        if history is None:
            memory_status, history = "unavailable", []
        request["history"] = history
        status, agent_headers, answer = await self._call_agent(scope, orjson.dumps(request), capability)
        output = _output_of(answer) if 200 <= status < 300 else None
        if output is not None:
            stored = await self._store(conversation, request["input"], output, caller)
            if not stored and memory_status == "ok":
                memory_status = "not-stored"
        elif memory_status == "ok":
            memory_status = "not-stored"
        proto.response_bytes(status, [*agent_headers, (api.MEMORY_STATUS_HEADER, memory_status)], answer)

    async def _replay(self, conversation: ConversationId, caller: CallerHeaders) -> list[dict[str, object]] | None:
        """The last turns as the agent sees them, or None when memory is unavailable."""
        reply = await self._forwarder.read(conversation, caller, self._replay_query)
        if reply.status != 200:
            return None
        try:
            summary, window = history_from(orjson.loads(reply.body))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None  # an unreadable history is memory unavailable: the turn goes on without it
        return within_budget(summary, window, self._settings.replay_tokens, self._count_tokens)

    async def _store(self, conversation: ConversationId, user: str, assistant: str, caller: CallerHeaders) -> bool:
        turn = new_message_id()
        body = orjson.dumps(
            {
                "entries": [
                    {"role": "user", "content": user, "id": f"{turn}-u"},
                    {"role": "assistant", "content": assistant, "id": f"{turn}-a"},
                ]
            }
        )
        reply = await self._forwarder.append(conversation, body, caller, identified=True)
        if reply.status != 200:
            return False
        try:
            length = int(orjson.loads(reply.body).get("length", 0))
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            return True  # stored; only the compaction hint is lost
        self.compactor.after_append(conversation, length, caller)
        return True

    async def _call_agent(
        self, scope: Scope, body: bytes, capability: str | None
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """The agent's answer to the request; with the caller's capability, the agent gets a turn handle bound
        to it for exactly as long as this call lasts."""
        relayed = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in scope.headers.items()
            if name in AGENT_REQUEST_HEADERS
        ]
        target = quote(scope.path, safe=_PATH_SAFE) + (f"?{scope.query_string}" if scope.query_string else "")
        try:
            if capability is None:
                response = await self._agent.request(scope.method, target, relayed, body)
            else:
                with self._turns.bound(capability) as handle:
                    relayed.append((_TURN, handle.encode()))
                    response = await self._agent.request(scope.method, target, relayed, body)
        except OSError as exc:  # HttpTimeout and TimeoutError are OSErrors too
            raise AgentUnavailable(
                f"agent on port {self._settings.agent_port} unreachable: {type(exc).__name__}"
            ) from exc
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in response.headers
            if name.lower().decode("latin-1") not in _NOT_RETURNED
        ]
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
