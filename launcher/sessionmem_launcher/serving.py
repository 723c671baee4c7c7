"""The launcher's HTTP serving: granian's embedded server (Rust, hyper) on the running event loop, one per
listening port, with the serving limits of ``sessionmem_infra.serving`` checked per request and the
listener's requests in flight counted (503 past ``max_connections``). What each layer enforces is in
docs/limits-launcher.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from functools import cache
from pathlib import Path
from typing import Protocol

from granian.constants import HTTPModes, Interfaces
from granian.log import LogLevels
from granian.rsgi import HTTPProtocol, Scope
from granian.server.embed import Server

from sessionmem_core import api
from sessionmem_core.env import ServingLimits
from sessionmem_core.errors import CapabilityNotAccepted, NotFound, Overloaded, SessionMemError
from sessionmem_core.keys import parse_conversation_id
from sessionmem_infra.serving import (
    RequestLimits,
    http1_settings,
    json_headers,
    open_connections,
    respond,
    respond_error,
)
from sessionmem_launcher.forward import CallerHeaders, Forwarder
from sessionmem_launcher.turns import TurnBindings

_LISTEN_TIMEOUT_SECONDS = 10.0


Handler = Callable[[Scope, HTTPProtocol], Awaitable[None]]


class RsgiApp(Protocol):
    async def __rsgi__(self, scope: Scope, proto: HTTPProtocol) -> None: ...


class Admission:
    """One request's way to its body and to a slot of its listener, in that order: ``body()`` reads the
    whole body and only then takes the slot (``Overloaded`` when all are taken). A client that sends a
    head and holds back its body (for up to the body timeout) holds one of granian's connections, twice
    as many as the slots (``open_connections``), never a slot that others' turns need."""

    __slots__ = ("_holding", "_limits", "_proto", "_scope")

    def __init__(self, limits: ListenerLimits, scope: Scope, proto: HTTPProtocol) -> None:
        self._limits, self._scope, self._proto = limits, scope, proto
        self._holding = False

    async def body(self) -> bytes:
        body = await self._limits.read_body(self._scope, self._proto)
        self._limits.admit()
        self._limits.in_flight += 1
        self._holding = True
        return body

    def release(self) -> None:
        if self._holding:
            self._holding = False
            self._limits.in_flight -= 1


# What serves one request whose head passed the limits: it takes the body (and a slot) from the admission.
AdmittedHandler = Callable[[Scope, HTTPProtocol, Admission], Awaitable[None]]


class ListenerLimits:
    """The serving limits of one listener (``sessionmem_infra.serving.RequestLimits``) and its count of
    requests in flight."""

    __slots__ = ("_limits", "in_flight", "requests")

    def __init__(self, limits: ServingLimits) -> None:
        self._limits = limits
        self.requests = RequestLimits(limits)
        self.in_flight = 0

    async def serve(self, scope: Scope, proto: HTTPProtocol, handler: AdmittedHandler) -> None:
        """Serve one request within the limits: its head checked, then ``handler`` run with its
        ``Admission`` (its body, then a slot: counted in flight from then on); refused with its typed
        answer when over a limit, and any typed error of the handler answered as such."""
        try:
            self.requests.check_head(scope)
        except SessionMemError as exc:
            respond_error(proto, exc)
            return
        admission = Admission(self, scope, proto)
        try:
            await handler(scope, proto, admission)
        except SessionMemError as exc:
            respond_error(proto, exc)
        finally:
            admission.release()

    def admit(self) -> None:
        """Raise ``Overloaded`` when the listener already serves its maximum of requests."""
        if self.in_flight >= self._limits.max_connections:
            raise Overloaded(f"more than {self._limits.max_connections} requests in flight")

    async def read_body(self, scope: Scope, proto: HTTPProtocol) -> bytes:
        headers = scope.headers
        expect = headers.get("expect", "").lower() == "100-continue"
        return await self.requests.read_body(
            proto, headers.get("content-length"), "transfer-encoding" in headers, expect_continue=expect
        )


class Listener(Protocol):
    """One listening port serving an app until ``stop()``; ``port`` is the port it listens on."""

    port: int

    async def stop(self) -> None: ...


# How the launcher opens a listener: (app, host, port, limits) -> a started listener. The launcher's own is
# ``serve_in_background``; a test hands one that can also bind port 0 (tests/support/serving.py).
Serve = Callable[[RsgiApp, str, int, ServingLimits], Awaitable[Listener]]


class EmbeddedServer:
    """One listening port served by granian on the running event loop until ``stop()``."""

    def __init__(self, app: RsgiApp, host: str, port: int, limits: ServingLimits) -> None:
        self._server = Server(
            app,
            address=host,
            port=port,
            interface=Interfaces.RSGI,
            http=HTTPModes.http1,
            websockets=False,
            backlog=1024,
            backpressure=open_connections(limits),
            http1_settings=http1_settings(limits),
            log_level=LogLevels.error,
        )
        self._host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self._task: asyncio.Task[None] | None = None
        self.port = port

    async def start(self) -> None:
        """Serve, and return once the port takes connections; the bind's own error when it fails."""
        task = self._task = asyncio.create_task(self._server.serve())
        async with asyncio.timeout(_LISTEN_TIMEOUT_SECONDS):
            while True:
                if task.done():
                    task.result()  # the bind failed: raise its error
                    raise RuntimeError("granian stopped before listening")
                try:
                    _reader, writer = await asyncio.open_connection(self._host, self.port)
                except OSError:
                    await asyncio.sleep(0.005)
                    continue
                writer.close()
                return

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.stop()  # type: ignore[no-untyped-call]
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None


async def serve_in_background(app: RsgiApp, host: str, port: int, limits: ServingLimits) -> EmbeddedServer:
    """Serve ``app`` (RSGI) on ``host``:``port`` on the running loop until ``stop()``."""
    server = EmbeddedServer(app, host, port, limits)
    await server.start()
    return server


# --- The agent's memory endpoint on 127.0.0.1: the memory API, each operation handed to the ``Forwarder``
# (which adds the pod's identity and parameters). The path is matched and the id parsed once, the query
# parsed once, the caller's turn resolved and the body read here; what refuses the call before it is
# forwarded is answered by ``Forwarder.refused``, as a failed ``memory.<op>`` span like any other.
# Besides, ``/healthz`` and ``/openapi.json`` (the committed document, ``openapi.json`` next to this
# module, so the wheel ships it).
#
# A call acts for an end user only through the live turn handle it names (``X-Sessionmem-Turn``), which the
# launcher resolves to the capability it holds for that turn; a user capability itself is never accepted
# here (``sessionmem_launcher.turns``).

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
        if reply.status == api.NOT_MODIFIED:  # no body, so no content type (RFC 9110, 15.4.5)
            proto.response_bytes(reply.status, [(api.ETAG_HEADER, reply.etag or "")], b"")
            return
        answer_headers = json_headers(reply.status)
        if reply.retry_after is not None:
            answer_headers = [*answer_headers, ("retry-after", reply.retry_after)]
        if reply.etag is not None:
            answer_headers = [*answer_headers, (api.ETAG_HEADER, reply.etag)]
        proto.response_bytes(reply.status, answer_headers, reply.body)

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
