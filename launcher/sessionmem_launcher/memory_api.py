"""The agent's memory endpoint on 127.0.0.1: the memory API, each operation handed to the ``Forwarder``
(which adds the pod's identity and parameters). The path is matched and the id parsed once, the query
parsed once, the caller's turn resolved and the body read here; what refuses the call before it is
forwarded is answered by ``Forwarder.refused``, as a failed ``memory.<op>`` span like any other.
Besides, ``/healthz`` and ``/openapi.json`` (the committed document, ``openapi.json`` next to this
module, so the wheel ships it).

A call acts for an end user only through the live turn handle it names (``X-Sessionmem-Turn``), which the
launcher resolves to the capability it holds for that turn; a user capability itself is never accepted
here (``sessionmem_launcher.turns``)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from granian.rsgi import HTTPProtocol, Scope

from sessionmem_core import api
from sessionmem_core.errors import CapabilityNotAccepted, NotFound, SessionMemError
from sessionmem_core.ids import parse_conversation_id
from sessionmem_infra.serving import json_headers, respond
from sessionmem_launcher.forward import CallerHeaders, Forwarder
from sessionmem_launcher.serving import Admission, ListenerLimits
from sessionmem_launcher.turns import TurnBindings

HEALTH_PATH = "/healthz"
OPENAPI_PATH = "/openapi.json"
HEALTHY = b'{"status":"ok"}'


class MemoryEndpoint:
    def __init__(self, forwarder: Forwarder, limits: ListenerLimits, turns: TurnBindings) -> None:
        self._forwarder = forwarder
        self._limits = limits
        self._turns = turns

    async def __rsgi__(self, scope: Scope, proto: HTTPProtocol) -> None:
        await self._limits.serve(scope, proto, self._serve)

    async def _serve(self, scope: Scope, proto: HTTPProtocol, admission: Admission) -> None:
        method, path = scope.method, scope.path
        if method == "GET" and path == HEALTH_PATH:
            respond(proto, 200, HEALTHY)
            return
        if method == "GET" and path == OPENAPI_PATH:
            respond(proto, 200, committed_openapi())
            return
        op, conversation_id = api.memory_route(method, path)
        headers = scope.headers
        try:
            conversation = None if conversation_id is None else parse_conversation_id(conversation_id)
            caller = CallerHeaders.of(headers.get, self._capability_of(scope))
            body = await admission.body()
        except SessionMemError as exc:
            reply = self._forwarder.refused(op, conversation_id or "", CallerHeaders.of(headers.get, None), exc)
        else:
            query = api.parse_query(scope.query_string)
            reply = await self._forwarder.forward(op, conversation, caller, query, body)
        proto.response_bytes(reply.status, json_headers(reply.status), reply.body)

    def _capability_of(self, scope: Scope) -> str | None:
        """The capability of the turn the call names, or None for a call outside any user's turn."""
        headers = scope.headers
        if api.USER_CAPABILITY_HEADER in headers:
            raise CapabilityNotAccepted(
                f"the memory endpoint never takes a user capability ({api.USER_CAPABILITY_HEADER}): send the "
                f"turn handle the launcher gave the agent with the request ({api.TURN_HEADER})"
            )
        handle = headers.get(api.TURN_HEADER)
        return None if handle is None else self._turns.resolve(handle)


OPENAPI_FILE = Path(__file__).with_name("openapi.json")


@cache
def committed_openapi() -> bytes:
    """The launcher's OpenAPI document as committed (``python -m sessionmem_launcher.openapi`` writes it)."""
    try:
        return OPENAPI_FILE.read_bytes()
    except OSError as exc:
        raise NotFound(f"the OpenAPI document is not installed ({OPENAPI_FILE})") from exc
