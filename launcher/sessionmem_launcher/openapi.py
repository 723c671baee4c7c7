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

from sessionmem_core import api, openapi, wire
from sessionmem_launcher.serving import HEALTH_PATH, OPENAPI_FILE, OPENAPI_PATH

_ID = "conversationId"


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # an OpenAPI path template; {conversationId} is the id
    op: str  # as api.memory_route names it
    summary: str
    answer: type[BaseModel] | None
    params: tuple[api.Parameter, ...] = ()
    body: type[BaseModel] | None = None
    # Besides 200 and the statuses every memory operation may answer (ANSWERED_BY_EVERY_OPERATION).
    statuses: dict[int, str] = field(default_factory=dict)


_TURN = api.Parameter(
    api.TURN_HEADER,
    "header",
    {"type": "string"},
    (
        "The handle of the end user's turn, as the launcher sent it to the agent with the request in "
        f"{api.TURN_HEADER} (required when the agent keeps memory per user). Good only until the agent answers "
        "that request. "
        f"A user capability ({api.USER_CAPABILITY_HEADER}) is never accepted here."
    ),
)
ANSWERED_BY_EVERY_OPERATION = {
    400: "Invalid conversation id or request, or a header value that is not visible ASCII (typed error)",
    401: (
        "The pod's token was refused; a per-user agent sent no turn handle (user_capability_required); the turn "
        "handle is not live (turn_not_live); or a user capability was sent (capability_not_accepted)"
    ),
    403: "The pod's identity may not use this memory",
    429: "The agent is over its request or transfer rate (rate_limited; Retry-After says when to retry)",
    414: "The request target exceeds the URL limit",
    431: "Too many request headers, or a request head over the header limit (the latter without a body)",
    503: "The proxy or its backend is unreachable, or the launcher has too many requests in flight",
}

# What the launcher adds to a declared operation's summary.
_DETAIL = {"export": ", all its pages joined into one History"}


def _model(name: str | None) -> type[BaseModel] | None:
    model = None if name is None else getattr(wire, name)
    assert model is None or issubclass(model, BaseModel), name
    return model


# The launcher serves every memory operation of the contract, each with the turn handle besides.
ROUTES: tuple[Route, ...] = tuple(
    Route(
        declared.method,
        declared.path,
        declared.op,
        declared.summary + _DETAIL.get(declared.op, ""),
        _model(declared.response),
        (*declared.params, _TURN),
        body=_model(declared.request),
        statuses=declared.statuses,
    )
    for declared in api.MEMORY_OPERATIONS
)


def _operation(route: Route) -> openapi.Operation:
    params = [api.CONVERSATION_ID] if _ID in route.path else []
    params += route.params
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
