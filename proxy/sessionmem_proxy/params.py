"""Request parameters, each declared once: its wire name, where it travels, its bounds and description.
The same declaration parses a request (typed 400 naming the parameter) and describes it in the OpenAPI
document (``sessionmem_proxy.openapi``), so the two cannot drift apart."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from sessionmem_core import api, env
from sessionmem_core.errors import InvalidRequest
from sessionmem_core.keys import Scope

Location = Literal["path", "query", "header"]
_TRUE = frozenset({"true", "1", "yes", "on"})
_BOOLEAN = _TRUE | {"false", "0", "no", "off"}


@dataclass(frozen=True, slots=True)
class Param:
    """``key``: the name a handler reads it under; ``name``: its name on the wire."""

    key: str
    name: str
    location: Location
    schema: Mapping[str, Any]
    parse: Callable[[str], Any]
    default: Any = None
    required: bool = False
    description: str = ""
    documented: bool = True

    def value(self, raw: str | None) -> Any:
        if raw is None:
            if self.required:
                raise InvalidRequest(f"{self.location}.{self.name}: required")
            return self.default
        return self.parse(raw)


def integer(key: str, name: str, default: int, lo: int, hi: int, description: str = "") -> Param:
    def parse(raw: str) -> int:
        if not (raw.isascii() and raw.isdigit()) or not lo <= int(raw) <= hi:
            raise InvalidRequest(f"query.{name}: must be an integer from {lo} to {hi}")
        return int(raw)

    schema = {"type": "integer", "minimum": lo, "maximum": hi, "default": default}
    return Param(key, name, "query", schema, parse, default, description=description)


def boolean(key: str, default: bool, description: str = "") -> Param:
    def parse(raw: str) -> bool:
        lowered = raw.lower()
        if lowered not in _BOOLEAN:
            raise InvalidRequest(f"query.{key}: must be a boolean")
        return lowered in _TRUE

    return Param(key, key, "query", {"type": "boolean", "default": default}, parse, default, description=description)


def text(
    key: str,
    name: str,
    *,
    default: str | None = None,
    min_length: int = 0,
    max_length: int = 1024,
    pattern: str | None = None,
    description: str = "",
) -> Param:
    matcher = re.compile(pattern) if pattern is not None else None

    def parse(raw: str) -> str:
        if not min_length <= len(raw) <= max_length:
            raise InvalidRequest(f"query.{name}: must be {min_length} to {max_length} characters")
        if matcher is not None and matcher.fullmatch(raw) is None:
            raise InvalidRequest(f"query.{name}: must match {pattern}")
        return raw

    schema: dict[str, Any] = {"type": "string", "minLength": min_length, "maxLength": max_length}
    if pattern is not None:
        schema["pattern"] = f"^{pattern}$"
    if default is not None:
        schema["default"] = default
    return Param(key, name, "query", schema, parse, default, required=default is None, description=description)


def choice(key: str, name: str, enum: type[StrEnum], default: StrEnum, description: str = "") -> Param:
    values = [member.value for member in enum]

    def parse(raw: str) -> StrEnum:
        try:
            return enum(raw)
        except ValueError as exc:
            raise InvalidRequest(f"query.{name}: must be one of {values}") from exc

    schema = {"type": "string", "enum": values, "default": default.value}
    return Param(key, name, "query", schema, parse, default, description=description)


def header(key: str, name: str, description: str = "", documented: bool = True) -> Param:
    return Param(key, name, "header", {"type": "string"}, str, None, description=description, documented=documented)


def _identity(raw: str) -> str:
    return raw  # validated by the operation itself (sessionmem_core.ids), inside its span


# --- the parameters the routes share ---
CONVERSATION_ID = Param(
    "conversation_id",
    "conversationId",
    "path",
    {"type": "string", "minLength": 1, "maxLength": 128},
    _identity,
    required=True,
    description="Conversation id (sessionmem_core.ids): percent-encoded UTF-8; NFC and NFD forms are two ids",
)
SCOPE = choice(
    "scope", api.SCOPE_PARAM, Scope, Scope.SESSION, "Requested scope; shared applies only to verified registry members"
)
CAP = integer("cap", api.CAP_PARAM, env.DEFAULT_CAP, 1, env.MAX_CAP, "Entries kept (LTRIM) after this write")
TTL = integer(
    "ttl_seconds", api.TTL_PARAM, env.DEFAULT_TTL_SECONDS, 1, env.MAX_TTL_SECONDS, "TTL in seconds this write refreshes"
)
REDACT = text(
    "redact",
    api.REDACT_PARAM,
    default="",
    max_length=256,
    description="Comma-separated redactors applied before storing (email, phone, card, or configured)",
)
READ_LIMIT = integer(
    "limit", api.LIMIT_PARAM, env.DEFAULT_REPLAY_MESSAGES, 0, env.MAX_READ_LIMIT, "How many of the newest entries"
)
EXPORT_OFFSET = integer(
    "offset", api.OFFSET_PARAM, 0, 0, 1 << 31, "Where this export page starts (the nextOffset of the page before)"
)
SUMMARY = boolean("summary", False, "Also return the rolling summary of older turns")
AUTHORIZATION = header("authorization", "authorization", "Bearer token of the calling agent")
CAPABILITY = header("capability", api.USER_CAPABILITY_HEADER, "The end user's signed run capability (perUser)")
TRACEPARENT = header("traceparent", api.TRACEPARENT_HEADER, documented=False)
IF_MATCH = header("if_match", "if-match", "Expected version (as returned by a read); '*' or absent: any")

CALLER = (AUTHORIZATION, TRACEPARENT)
NAMESPACE = Param(
    "namespace", "namespace", "path", {"type": "string"}, _identity, required=True,
    description="Namespace of the AgentDeployment",
)  # fmt: skip
AGENT = Param(
    "agent", "agent", "path", {"type": "string"}, _identity, required=True, description="Name of the AgentDeployment"
)
USER = Param(
    "user", "user", "path", {"type": "string", "minLength": 1, "maxLength": 256}, _identity, required=True,
    description="The end user's id, as the caller's side signs it into capabilities",
)  # fmt: skip
REGISTRY = Param(
    "registry",
    "registry",
    "path",
    {"type": "string"},
    _identity,
    required=True,
    description="Name of the AgentRegistry",
)
ADMIN_AUTHORIZATION = header(
    "authorization", "authorization", "Bearer token of the administrator: their own Kubernetes credential"
)
ADMIN = (NAMESPACE, AGENT, ADMIN_AUTHORIZATION, TRACEPARENT)
CONVERSATION = (CONVERSATION_ID, SCOPE, *CALLER, CAPABILITY)
WRITE = (CAP, TTL, REDACT)


@dataclass(slots=True)
class RawRequest:
    """What a handler's parameters are read from: the decoded path values, the query pairs and the headers
    (lower-case names)."""

    path_values: Mapping[str, str]
    query: Mapping[str, str]
    headers: Mapping[str, str]


def parse(params: Sequence[Param], request: RawRequest) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for param in params:
        if param.location == "path":
            raw = request.path_values.get(param.name)
        elif param.location == "query":
            raw = request.query.get(param.name)
        else:
            raw = request.headers.get(param.name)
        # Most optional parameters are absent from most requests: their default without a call.
        values[param.key] = param.default if raw is None and not param.required else param.value(raw)
    return values
