"""The proxy's entrance and its one route table. Every operation is declared once, as (method, path,
parameters, handler, request model, response model, statuses); ``ProxyApp`` (an RSGI application, built by
``sessionmem_proxy.app.create_app``) serves every request from that table within the serving limits, and
``sessionmem_proxy.openapi`` documents it; nothing else lists routes.

Paths are matched on the path as granian decoded it: a conversation id is whatever sits between the prefix
and the operation's suffix, checked by the one id rule (``sessionmem_core.keys``), which refuses the ``/``
of a ``%2F`` and the U+FFFD granian puts where escapes were not UTF-8.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic

from granian.rsgi import HTTPProtocol, Scope
from pydantic import BaseModel, ValidationError

from sessionmem_core import api, wire
from sessionmem_core.errors import (
    BackendUnavailable,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    RateLimited,
    SessionMemError,
)
from sessionmem_infra.serving import (
    CONNECTION_CLOSE,
    BodyMeter,
    Reply,
    RequestLimits,
    closes_connection,
    error_reply,
    internal_error_reply,
    json_reply,
    text_reply,
)
from sessionmem_proxy import admin, lifecycle, operations, rbac
from sessionmem_proxy.admission import AgentIdentity, ProxyContext, identify, observe_backend
from sessionmem_proxy.operations import P, Param, RawRequest, parse
from sessionmem_proxy.tokenreview import TokenReviewAuthenticator

Handler = Callable[[ProxyContext, P, BaseModel | None], Awaitable[Reply]]

# Statuses any request may get from the serving limits (sessionmem_infra.serving, docs/limits.md): a header
# value that is not visible ASCII, a URL or a head over its limit; and a counted route, from a worker
# already serving its maximum of requests.
SERVING_STATUSES = frozenset({400, 414, 431})
OVERLOADED_STATUS = 503
# An operation on behalf of a verified caller: a refused parameter or id, no or a bad token, a token that
# is not an agent's, the identity service or the backend unreachable.
CALLER_STATUSES = frozenset({400, 401, 403, 429, 503})


@dataclass(frozen=True, slots=True)
class Route(Generic[P]):
    """``params``: the typed parameter set the app parses the request into and hands ``handler``."""

    op: str
    method: str
    path: str
    params: type[P]
    handler: Handler[P]
    response: type[BaseModel] | None
    statuses: frozenset[int]
    summary: str
    tag: str
    request: type[BaseModel] | None = None
    content_type: str = "application/json"
    # Counted against the worker's request limit. Liveness is not: a kubelet would restart a pod whose
    # worker is merely busy.
    counted: bool = True

    @property
    def declared_params(self) -> tuple[Param, ...]:
        return self.params.PARAMS

    @property
    def all_statuses(self) -> frozenset[int]:
        overload = {OVERLOADED_STATUS} if self.counted else set()
        return self.statuses | SERVING_STATUSES | overload | {200}


async def _healthz(_ctx: ProxyContext, _p: operations.NoParams, _b: BaseModel | None) -> Reply:
    return json_reply(b'{"status":"ok"}')


async def _readyz(ctx: ProxyContext, _p: operations.NoParams, _b: BaseModel | None) -> Reply:
    try:
        await ctx.store.ping()
    except BackendUnavailable as exc:
        observe_backend(ctx, exc)
        raise
    observe_backend(ctx, None)
    return json_reply(b'{"status":"ready"}')


async def _metrics(ctx: ProxyContext, _p: operations.NoParams, _b: BaseModel | None) -> Reply:
    reviews: dict[str, Mapping[str, int]] = {}
    if isinstance(ctx.authenticator, TokenReviewAuthenticator):
        reviews["agent"] = ctx.authenticator.reviews
    if isinstance(ctx.admin, rbac.KubeAdminAuthorizer):
        reviews["admin"] = ctx.admin.reviews
    return text_reply(ctx.metrics.render(reviews).encode(), "text/plain; version=0.0.4")


async def _openapi(ctx: ProxyContext, _p: operations.NoParams, _b: BaseModel | None) -> Reply:
    return json_reply(ctx.openapi())


def _model(name: str | None) -> type[BaseModel] | None:
    model = None if name is None else getattr(wire, name)
    assert model is None or issubclass(model, BaseModel), name
    return model


def _memory(op: str, kind: type[P], handler: Handler[P], tag: str = "memory", detail: str = "") -> Route[P]:
    """The route of a memory operation as the contract declares it (``api.MEMORY_OPERATIONS``: method,
    path, models and the statuses of its own), served by ``handler`` with the parameter set ``kind``;
    ``detail`` adds to the declared summary what is the proxy's own."""
    declared = api.MEMORY_OPERATION[op]
    return Route(
        op,
        declared.method,
        declared.path,
        kind,
        handler,
        _model(declared.response),
        CALLER_STATUSES | frozenset(declared.statuses),
        declared.summary + detail,
        tag,
        request=_model(declared.request),
    )


_ONE = api.CONVERSATION_PATH_TEMPLATE
ROUTES = (  # no annotation: each route is checked against its own handler
    Route(
        "healthz",
        "GET",
        "/healthz",
        operations.NoParams,
        _healthz,
        wire.Health,
        frozenset(),
        "Liveness",
        "health",
        counted=False,
    ),
    Route(
        "readyz",
        "GET",
        api.PROXY_READY_PATH,
        operations.NoParams,
        _readyz,
        wire.Health,
        frozenset({503}),
        "Readiness (Valkey)",
        "health",
    ),
    Route(
        "metrics",
        "GET",
        "/metrics",
        operations.NoParams,
        _metrics,
        None,
        frozenset(),
        "Prometheus metrics",
        "health",
        content_type="text/plain",
    ),
    Route(
        "openapi", "GET", "/openapi.json", operations.NoParams, _openapi, None, frozenset(), "This document", "health"
    ),
    # The memory operations: method, path, summary and models as the contract declares them.
    _memory("get", operations.ReadParams, operations.read_entries, "memory"),
    _memory(
        "append",
        operations.AppendParams,
        operations.append_entries,
    ),
    _memory("search", operations.SearchParams, lifecycle.search, "memory"),
    _memory(
        "export",
        operations.ExportParams,
        lifecycle.export,
        "lifecycle",
        ", one page of about 1 MiB at a time (nextOffset: where the next starts)",
    ),
    _memory("info", operations.ConversationParams, lifecycle.info, "lifecycle"),
    _memory(
        "replace",
        operations.ReplaceParams,
        lifecycle.replace,
    ),
    _memory("delete", operations.ConditionalParams, lifecycle.delete, "memory"),
    _memory("pop", operations.ConditionalParams, lifecycle.pop, "memory"),
    _memory("rewind", operations.ConditionalParams, lifecycle.rewind, "memory"),
    _memory(
        "compact",
        operations.CompactParams,
        lifecycle.compact,
        "memory",
    ),
    _memory(
        "fork",
        operations.ForkParams,
        lifecycle.fork,
        "memory",
    ),
    _memory("list", operations.ListParams, lifecycle.list_conversations, "lifecycle"),
    _memory(
        "metadata",
        operations.ConversationParams,
        lifecycle.set_metadata,
        "lifecycle",
    ),
    _memory("clear", operations.ClearParams, lifecycle.clear_all, "lifecycle"),
    Route(
        "admin_erase_agent",
        "DELETE",
        api.ADMIN_AGENT_MEMORY_PATH,
        operations.AdminParams,
        admin.erase_agent_memory,
        wire.ErasureReceipt,
        CALLER_STATUSES,
        "Erase all of an agent's memory, its users' buckets included (RBAC: delete agentdeployments/memory)",
        "administration",
    ),
    Route(
        "admin_erase_user",
        "DELETE",
        api.ADMIN_USER_MEMORY_PATH,
        operations.AdminUserParams,
        admin.erase_user_memory,
        wire.ErasureReceipt,
        CALLER_STATUSES,
        "Erase one end user's memory with an agent (RBAC: delete agentdeployments/memory)",
        "administration",
    ),
    Route(
        "admin_erase_user_everywhere",
        "DELETE",
        api.ADMIN_NAMESPACE_USER_MEMORY_PATH,
        operations.AdminNamespaceUserParams,
        admin.erase_user_everywhere,
        wire.ErasureReceipt,
        CALLER_STATUSES,
        "Erase one end user's memory with every agent of a namespace (RBAC: delete agentdeployments/memory)",
        "administration",
    ),
    Route(
        "admin_erase_registry",
        "DELETE",
        api.ADMIN_REGISTRY_MEMORY_PATH,
        operations.AdminRegistryParams,
        admin.erase_registry_memory,
        wire.ErasureReceipt,
        CALLER_STATUSES,
        "Erase every shared conversation of a registry's team (RBAC: delete agentregistries/memory)",
        "administration",
    ),
    Route(
        "admin_conversations",
        "GET",
        api.ADMIN_CONVERSATIONS_PATH,
        operations.AdminListParams,
        admin.list_agent_conversations,
        wire.AdminConversationList,
        CALLER_STATUSES,
        "List an agent's conversations, with size and last write (RBAC: list agentdeployments/memory)",
        "administration",
    ),
    Route(
        "admin_show",
        "GET",
        api.ADMIN_CONVERSATION_PATH,
        operations.AdminShowParams,
        admin.show_conversation,
        wire.Transcript,
        CALLER_STATUSES | {404},
        "One conversation's newest entries with authors and times (RBAC: get agentdeployments/memory)",
        "administration",
    ),
    Route(
        "admin_erase_conversation",
        "DELETE",
        api.ADMIN_CONVERSATION_PATH,
        operations.AdminConversationParams,
        admin.erase_conversation,
        wire.ErasureReceipt,
        CALLER_STATUSES,
        "Erase one conversation of an agent (RBAC: delete agentdeployments/memory)",
        "administration",
    ),
    Route(
        "admin_export",
        "GET",
        api.ADMIN_EXPORT_PATH,
        operations.AdminExportParams,
        admin.export_conversation,
        None,
        CALLER_STATUSES | {404},
        "Export one conversation of an agent as JSON lines, a page of about 1 MiB at a time (the "
        f"{api.NEXT_OFFSET_HEADER} header: where the next starts; RBAC: get agentdeployments/memory)",
        "administration",
        content_type=api.NDJSON,
    ),
    Route(
        "admin_stats",
        "GET",
        api.ADMIN_STATS_PATH,
        operations.AdminParams,
        admin.agent_memory_stats,
        wire.AgentMemoryStats,
        CALLER_STATUSES,
        "An agent's stored conversations and bytes against its quotas (RBAC: get agentdeployments/memory)",
        "administration",
    ),
    _memory("erase_user", operations.EraseUserParams, lifecycle.erase_user, "lifecycle"),
)

_CONVERSATIONS = f"{api.API_PREFIX}/conversations/"


class RouteTable:
    """Finds the route of a (method, decoded path); raises a typed 404 or 405 (with the allowed methods)."""

    def __init__(self, routes: tuple[Route[Any], ...] = ROUTES) -> None:
        self.routes = routes
        self._fixed: dict[str, dict[str, Route[Any]]] = {}
        self._conversation: dict[str, dict[str, Route[Any]]] = {}
        # Paths of named segments ({name}: one segment), matched segment by segment.
        self._templates: dict[tuple[str, ...], dict[str, Route[Any]]] = {}
        for route in routes:
            if route.path.startswith(_ONE):
                suffix = route.path[len(_ONE) :].lstrip("/")
                self._conversation.setdefault(suffix, {})[route.method] = route
            elif "{" in route.path:
                self._templates.setdefault(tuple(route.path.split("/")), {})[route.method] = route
            else:
                self._fixed.setdefault(route.path, {})[route.method] = route
        self._suffixes = [suffix for suffix in self._conversation if suffix]

    def match(self, method: str, path: str) -> tuple[Route[Any], Mapping[str, str]]:
        fixed = self._fixed.get(path)
        if fixed is not None:
            return _by_method(fixed, method), {}
        if not path.startswith(_CONVERSATIONS):
            return self._match_template(method, path)
        rest = path[len(_CONVERSATIONS) :]
        suffix = ""
        for candidate in self._suffixes:
            if rest.endswith("/" + candidate):
                suffix, rest = candidate, rest[: -len(candidate) - 1]
                break
        route = _by_method(self._conversation[suffix], method)
        return route, {operations.CONVERSATION_ID.name: rest}

    def _match_template(self, method: str, path: str) -> tuple[Route[Any], Mapping[str, str]]:
        segments = path.split("/")
        for template, by_method in self._templates.items():
            if len(template) != len(segments):
                continue
            values: dict[str, str] = {}
            for part, segment in zip(template, segments, strict=True):
                if part.startswith("{"):
                    if not segment:
                        break
                    values[part[1:-1]] = segment
                elif part != segment:
                    break
            else:
                return _by_method(by_method, method), values
        raise NotFound(f"no route {path}")


class NotAllowedHere(MethodNotAllowed):
    """A 405 that knows which methods the path allows (its ``Allow`` header)."""

    def __init__(self, method: str, allowed: list[str]) -> None:
        self.allow = ", ".join(allowed)
        super().__init__(f"{method} is not allowed here; allowed: {self.allow}")


def _by_method(routes: dict[str, Route[Any]], method: str) -> Route[Any]:
    route = routes.get(method)
    if route is None:
        raise NotAllowedHere(method, sorted(routes))
    return route


# --- the entrance: every request served from the route table

_LOG = logging.getLogger("sessionmem.proxy")


class InFlight:
    """Counts the requests a worker is serving; ``enter`` says False when it already serves its maximum
    (the caller answers 503 without reading the request)."""

    __slots__ = ("count", "maximum")

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.count = 0

    def enter(self) -> bool:
        if self.count >= self.maximum:
            return False
        self.count += 1
        return True

    def leave(self) -> None:
        self.count -= 1


class ProxyApp:
    """Serves every request from the route table, within the serving limits; closes what it owns when
    granian stops the worker (``__rsgi_del__``, or ``aclose``)."""

    def __init__(
        self,
        ctx: ProxyContext,
        limits: RequestLimits,
        closers: list[Callable[[], Awaitable[None]]],
        table: RouteTable | None = None,
    ) -> None:
        self.ctx = ctx
        self.limits = limits
        self.table = table or RouteTable()
        self.in_flight = InFlight(limits.serving.max_connections)
        self._closers = closers

    async def __rsgi__(self, scope: Scope, proto: HTTPProtocol) -> None:
        # An HTTP request (granian serves no websockets here), served in this coroutine rather than in a
        # method of its own: one coroutine less per request.
        try:
            headers = self.limits.check_head(scope)
            route, path_values = self.table.match(scope.method, scope.path)
        except SessionMemError as exc:
            _respond(proto, _typed(exc))
            return
        _respond(proto, await self._serve(route, path_values, scope.query_string, headers, proto))

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        # A worker process's loop has stopped by now; an embedded server's loop still runs, and whoever
        # embeds the app closes it.
        if not loop.is_running():
            loop.run_until_complete(self.aclose())

    async def aclose(self) -> None:
        closers, self._closers = self._closers, []
        for close in closers:
            await close()

    async def _serve(
        self,
        route: Route[Any],
        path_values: Mapping[str, str],
        query: str,
        headers: dict[str, str],
        proto: HTTPProtocol,
    ) -> Reply:
        """The reply of one routed request; every failure becomes a typed answer here.

        The caller is verified, and its body read, before the request takes one of the worker's slots
        (``InFlight``): a client that sends a head and holds back its body, or one without credentials,
        holds a connection (granian's, bounded per worker) but never a slot other agents need. A body is
        read only from a verified agent within its transfer quota (fail-closed: no body is read, parsed
        or validated for anyone else)."""
        try:
            values = parse(route.params, RawRequest(path_values, dict(api.parse_query(query)), headers))
            if route.request is None:
                if hasattr(values, "verified"):  # an operation of an agent: verified before it takes a slot
                    values.verified = await self._verify(route, headers, upload=False)
                return await self._in_slot(route, values, None)
            try:
                uploader = await self._verify(route, headers, upload=True)
            except SessionMemError as exc:
                # The body stays unread: the connection cannot carry another request.
                refused = await _refused(exc)
                refused.headers = [*refused.headers, CONNECTION_CLOSE]
                return refused
            values.verified = uploader  # a route with a body acts on one conversation
            meter = BodyMeter()
            try:
                raw = await self.limits.read_body(
                    proto,
                    headers.get("content-length"),
                    "transfer-encoding" in headers,
                    meter,
                    expect_continue=headers.get("expect", "").lower() == "100-continue",
                )
                return await self._in_slot(route, values, raw)
            finally:
                # Charged once answered, so the body's own size never refuses it; the agent's next request
                # finds its bucket in debt if this one took more than was left. Refused bodies (413, 408,
                # 400) count too: what was read and dropped cost the same.
                self.ctx.quotas.charge(uploader.owner, meter.received)
        except SessionMemError as exc:
            return await _refused(exc)
        except Exception as exc:
            _LOG.exception("unhandled error")
            return internal_error_reply(exc)

    async def _in_slot(self, route: Route[Any], values: Any, raw: bytes | None) -> Reply:
        """The operation, run in one of the worker's slots (a 503 when all are taken); ``raw``: the body
        already read, validated here."""
        if route.counted and not self.in_flight.enter():
            return error_reply(Overloaded("this worker is at its request limit; retry"))
        try:
            if raw is None or route.request is None:
                return await route.handler(self.ctx, values, None)
            try:
                body = route.request.model_validate_json(raw)
            except ValidationError as exc:
                raise InvalidRequest(_problems(exc)) from exc
            return await route.handler(self.ctx, values, body)
        finally:
            if route.counted:
                self.in_flight.leave()

    async def _verify(self, route: Route[Any], headers: Mapping[str, str], upload: bool) -> AgentIdentity:
        """The calling agent, verified before its request takes a slot; for a route with a body
        (``upload``) also its transfer quota, checked before the body is read: a stranger is refused
        (401/403, the connection closed) and an agent whose bucket is in debt gets its 429, both without
        the proxy reading or parsing what they send. The refusal is observed as the operation's outcome,
        as the operation would have."""
        started = time.perf_counter()
        try:
            identity = await identify(self.ctx, headers.get("authorization"))
            if upload:
                await self.ctx.quotas.admit_upload(identity.owner)
        except SessionMemError as exc:
            self.ctx.metrics.observe(route.op, exc.error_type, (time.perf_counter() - started) * 1000.0)
            raise
        return identity


async def _refused(error: SessionMemError) -> Reply:
    """The typed answer of a request refused or failed, once its hold has passed (a 429 to an agent that
    asked again too soon: ``Quotas.refusal``). It waits here, after the request left its slot: holding
    refusals costs the worker a timer each, never one of its request slots."""
    if isinstance(error, RateLimited) and error.hold_seconds > 0:
        await asyncio.sleep(error.hold_seconds)
    return _typed(error)


def _typed(error: SessionMemError) -> Reply:
    if isinstance(error, NotAllowedHere):
        return error_reply(error, [("allow", error.allow)])
    return error_reply(error)


def _problems(exc: ValidationError) -> str:
    return (
        "; ".join(
            f"body.{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg', 'invalid')}"
            for err in exc.errors()[:5]
        )
        or "invalid body"
    )


def _respond(proto: HTTPProtocol, reply: Reply) -> None:
    headers = reply.headers
    if closes_connection(reply.status):
        headers = [*headers, CONNECTION_CLOSE]
    proto.response_bytes(reply.status, headers, reply.body)
