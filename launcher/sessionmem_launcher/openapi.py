"""The launcher's OpenAPI document, built from its route declarations (``ROUTES``) and the wire models of
``sessionmem_core.wire`` by the one generator (``sessionmem_core.openapi``), and committed as
``openapi.json`` next to this module, which the memory endpoint serves as it is (building it needs
pydantic, which the launcher does not load at run time).

    python -m sessionmem_launcher.openapi           # rewrite the committed document
    python -m sessionmem_launcher.openapi --check   # exit 1 when it is not current

Only what the launcher really takes is declared: the pod's own parameters (scope, cap, TTL, redactors) and
credentials are set by the launcher and are not parameters of this API; only statuses the launcher answers
are listed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from sessionmem_core import api, env, openapi, wire
from sessionmem_launcher.memory_api import HEALTH_PATH, OPENAPI_FILE, OPENAPI_PATH

_ID = "conversationId"


@dataclass(frozen=True)
class Param:
    name: str
    schema: dict[str, Any]
    description: str
    where: str = "query"
    required: bool = False


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # an OpenAPI path template; {conversationId} is the id
    op: str  # as api.memory_route names it
    summary: str
    answer: type[BaseModel]
    params: tuple[Param, ...] = ()
    body: type[BaseModel] | None = None
    # Besides 200 and the statuses every memory operation may answer (ANSWERED_BY_EVERY_OPERATION).
    statuses: dict[int, str] = field(default_factory=dict)


_CONVERSATION = f"{api.API_PREFIX}/conversations/{{{_ID}}}"
_TURN = Param(
    api.TURN_HEADER,
    {"type": "string"},
    (
        "The handle of the end user's turn, as the launcher sent it to the agent with the request in "
        f"{api.TURN_HEADER} (required when the agent keeps memory per user). Good only until the agent answers "
        "that request. "
        f"A user capability ({api.USER_CAPABILITY_HEADER}) is never accepted here."
    ),
    where="header",
)
_BODY_STATUSES = {
    408: "The request body did not arrive within the body timeout",
    413: "The request body exceeds the body limit",
}

ANSWERED_BY_EVERY_OPERATION = {
    400: "Invalid conversation id or request, or a header value that is not visible ASCII (typed error)",
    401: (
        "The pod's token was refused; a per-user agent sent no turn handle (user_capability_required); the turn "
        "handle is not live (turn_not_live); or a user capability was sent (capability_not_accepted)"
    ),
    403: "The pod's identity may not use this memory",
    414: "The request target exceeds the URL limit",
    431: "Too many request headers, or a request head over the header limit (the latter without a body)",
    503: "The proxy or its backend is unreachable, or the launcher has too many requests in flight",
}

ROUTES: tuple[Route, ...] = (
    Route(
        "GET",
        f"{_CONVERSATION}/entries",
        "get",
        "Read the last entries of a conversation",
        wire.History,
        (
            Param(
                api.LIMIT_PARAM,
                {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": env.MAX_READ_LIMIT,
                    "default": env.DEFAULT_REPLAY_MESSAGES,
                },
                "How many of the newest entries",
            ),
            Param("summary", {"type": "boolean", "default": False}, "Also return the rolling summary of older turns"),
            _TURN,
        ),
    ),
    Route(
        "POST",
        f"{_CONVERSATION}/entries",
        "append",
        "Append a batch (normally one user/assistant exchange) atomically",
        wire.AppendResponse,
        (_TURN,),
        body=wire.AppendRequest,
        statuses=_BODY_STATUSES,
    ),
    Route(
        "GET",
        f"{_CONVERSATION}/search",
        "search",
        "Keyword search within one conversation",
        wire.SearchResponse,
        (
            Param("q", {"type": "string", "minLength": 1, "maxLength": 1024}, "Words to look for", required=True),
            Param(api.LIMIT_PARAM, {"type": "integer", "minimum": 1, "maximum": 100, "default": 10}, "Most matches"),
            _TURN,
        ),
    ),
    Route("GET", f"{_CONVERSATION}/export", "export", "Export a whole conversation", wire.History, (_TURN,)),
    Route(
        "GET",
        _CONVERSATION,
        "info",
        "Whether a conversation exists, its version, size and remaining TTL",
        wire.ConversationInfo,
        (_TURN,),
    ),
    Route(
        "PUT",
        _CONVERSATION,
        "replace",
        "Replace (seed) a conversation, conditional on its version",
        wire.ReplaceResponse,
        (
            Param(
                "if-match",
                {"type": "string"},
                "Expected version (as returned by a read); '*' or absent: any",
                where="header",
            ),
            _TURN,
        ),
        body=wire.ReplaceRequest,
        statuses={**_BODY_STATUSES, 412: "If-Match does not match the version"},
    ),
    Route("DELETE", _CONVERSATION, "delete", "Erase a conversation", wire.DeleteResponse, (_TURN,)),
    Route(
        "GET",
        api.CONVERSATIONS_PATH,
        "list",
        "List the agent's conversations (paginated)",
        wire.ConversationList,
        (
            Param(
                api.LIMIT_PARAM,
                {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
                "Page size hint (Valkey SCAN): a page may hold a few more or fewer",
            ),
            Param("cursor", {"type": "string", "pattern": "^[0-9]{1,20}$", "default": "0"}, "Where the page starts"),
            _TURN,
        ),
    ),
    Route(
        "DELETE",
        api.USER_CONVERSATIONS_PATH,
        "erase_user",
        "Erase everything of the end user whose turn the handle is, across the agent's conversations",
        wire.UserErasure,
        (_TURN,),
    ),
)


_CONVERSATION_ID = openapi.Parameter(
    _ID,
    "path",
    {"type": "string", "minLength": 1, "maxLength": 128},
    "Conversation id: see the id rule in sessionmem_core.ids",
    required=True,
)


def _operation(route: Route) -> openapi.Operation:
    params = [_CONVERSATION_ID] if _ID in route.path else []
    params += [openapi.Parameter(p.name, p.where, p.schema, p.description, p.required) for p in route.params]
    errors = {**ANSWERED_BY_EVERY_OPERATION, **route.statuses}
    return openapi.Operation(
        route.op, route.method, route.path, route.summary, "memory", params, route.answer, errors, route.body
    )


_HEALTH = (
    openapi.Operation("healthz", "GET", HEALTH_PATH, "The launcher is up", "health", (), wire.Health),
    openapi.Operation("openapi", "GET", OPENAPI_PATH, "This document", "health", (), None),
)


def build() -> dict[str, Any]:
    return openapi.document(
        "sessionmem launcher memory endpoint",
        (
            "The agent's memory API on 127.0.0.1 inside its pod. The launcher forwards each call to the "
            "state-layer proxy with the pod's identity; scope, cap, TTL and redactors are the pod's "
            "configuration and not parameters of this API (values an agent sends for them are dropped)."
        ),
        [*_HEALTH, *(_operation(route) for route in ROUTES)],
    )


def render() -> bytes:
    return openapi.render(build())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sessionmem_launcher.openapi", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed document is not current")
    args = parser.parse_args(argv)
    current = render()
    if args.check:
        if OPENAPI_FILE.read_bytes() != current:
            print(f"{OPENAPI_FILE} is not current: run python -m sessionmem_launcher.openapi", file=sys.stderr)
            return 1
        return 0
    OPENAPI_FILE.write_bytes(current)
    return 0


if __name__ == "__main__":
    sys.exit(main())
