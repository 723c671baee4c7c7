"""The proxy's one route table: every operation declared once, as (method, path, parameters, handler,
request model, response model, statuses). The app (``sessionmem_proxy.app``) serves requests from it and
``sessionmem_proxy.openapi`` documents it; nothing else lists routes.

Paths are matched on the path as granian decoded it: a conversation id is whatever sits between the prefix
and the operation's suffix, checked by the one id rule (``sessionmem_core.ids``), which refuses the ``/``
of a ``%2F`` and the U+FFFD granian puts where escapes were not UTF-8.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic

from pydantic import BaseModel

from sessionmem_core import api, wire
from sessionmem_core.errors import MethodNotAllowed, NotFound
from sessionmem_proxy import admin, hot, lifecycle, params, rbac
from sessionmem_proxy.context import ProxyContext
from sessionmem_proxy.params import P, Param
from sessionmem_proxy.replies import Reply, json_reply, text_reply
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
# A request that stores: over the agent's storage quota.
STORE_STATUSES = frozenset({507})
# A request with a body: over the body limit, or not arrived within the body timeout.
BODY_STATUSES = frozenset({400, 408, 413})


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


async def _healthz(_ctx: ProxyContext, _p: params.NoParams, _b: BaseModel | None) -> Reply:
    return json_reply(b'{"status":"ok"}')


async def _readyz(ctx: ProxyContext, _p: params.NoParams, _b: BaseModel | None) -> Reply:
    await ctx.store.ping()
    return json_reply(b'{"status":"ready"}')


async def _metrics(ctx: ProxyContext, _p: params.NoParams, _b: BaseModel | None) -> Reply:
    reviews: dict[str, Mapping[str, int]] = {}
    if isinstance(ctx.authenticator, TokenReviewAuthenticator):
        reviews["agent"] = ctx.authenticator.reviews
    if isinstance(ctx.admin, rbac.KubeAdminAuthorizer):
        reviews["admin"] = ctx.admin.reviews
    return text_reply(ctx.metrics.render(reviews).encode(), "text/plain; version=0.0.4")


async def _openapi(ctx: ProxyContext, _p: params.NoParams, _b: BaseModel | None) -> Reply:
    return json_reply(ctx.openapi())


def _model(name: str | None) -> type[BaseModel] | None:
    model = None if name is None else getattr(wire, name)
    assert model is None or issubclass(model, BaseModel), name
    return model


def _memory(
    op: str, kind: type[P], handler: Handler[P], statuses: frozenset[int], tag: str = "memory", detail: str = ""
) -> Route[P]:
    """The route of a memory operation as the contract declares it (``api.MEMORY_OPERATIONS``), served by
    ``handler`` with the parameter set ``kind``; ``detail`` adds to the declared summary what is the
    proxy's own."""
    declared = api.MEMORY_OPERATION[op]
    return Route(
        op,
        declared.method,
        declared.path,
        kind,
        handler,
        _model(declared.response),
        statuses,
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
        params.NoParams,
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
        "/readyz",
        params.NoParams,
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
        params.NoParams,
        _metrics,
        None,
        frozenset(),
        "Prometheus metrics",
        "health",
        content_type="text/plain",
    ),
    Route("openapi", "GET", "/openapi.json", params.NoParams, _openapi, None, frozenset(), "This document", "health"),
    # The memory operations: method, path, summary and models as the contract declares them.
    _memory("get", params.ReadParams, hot.read_entries, CALLER_STATUSES, "memory"),
    _memory("append", params.AppendParams, hot.append_entries, CALLER_STATUSES | BODY_STATUSES | STORE_STATUSES),
    _memory("search", params.SearchParams, lifecycle.search, CALLER_STATUSES, "memory"),
    _memory(
        "export",
        params.ExportParams,
        lifecycle.export,
        CALLER_STATUSES,
        "lifecycle",
        ", one page of about 1 MiB at a time (nextOffset: where the next starts)",
    ),
    _memory("info", params.ConversationParams, lifecycle.info, CALLER_STATUSES, "lifecycle"),
    _memory(
        "replace", params.ReplaceParams, lifecycle.replace, CALLER_STATUSES | BODY_STATUSES | STORE_STATUSES | {412}
    ),
    _memory("delete", params.ConditionalParams, lifecycle.delete, CALLER_STATUSES | {412}, "memory"),
    _memory("pop", params.ConditionalParams, lifecycle.pop, CALLER_STATUSES | {412}, "memory"),
    _memory("rewind", params.ConditionalParams, lifecycle.rewind, CALLER_STATUSES | BODY_STATUSES | {412}, "memory"),
    _memory(
        "fork", params.ForkParams, lifecycle.fork, CALLER_STATUSES | BODY_STATUSES | STORE_STATUSES | {409}, "memory"
    ),
    _memory("list", params.ListParams, lifecycle.list_conversations, CALLER_STATUSES, "lifecycle"),
    _memory("clear", params.ClearParams, lifecycle.clear_all, CALLER_STATUSES, "lifecycle"),
    Route(
        "admin_erase_agent",
        "DELETE",
        api.ADMIN_AGENT_MEMORY_PATH,
        params.AdminParams,
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
        params.AdminUserParams,
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
        params.AdminNamespaceUserParams,
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
        params.AdminRegistryParams,
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
        params.AdminListParams,
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
        params.AdminShowParams,
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
        params.AdminConversationParams,
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
        params.AdminExportParams,
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
        params.AdminParams,
        admin.agent_memory_stats,
        wire.AgentMemoryStats,
        CALLER_STATUSES,
        "An agent's stored conversations and bytes against its quotas (RBAC: get agentdeployments/memory)",
        "administration",
    ),
    _memory("erase_user", params.EraseUserParams, lifecycle.erase_user, CALLER_STATUSES, "lifecycle"),
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
        return route, {params.CONVERSATION_ID.name: rest}

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
