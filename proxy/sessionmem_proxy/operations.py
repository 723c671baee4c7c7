"""Each operation's parameters, and the two operations of every agent turn (reading the window,
appending the exchange).

Request parameters are each declared once: their wire name, where they travel, their bounds and
description. The same declaration parses a request (typed 400 naming the parameter) and describes it in
the OpenAPI document (``sessionmem_proxy.openapi``), so the two cannot drift apart. Each route's handler
gets its parameters as one typed object (a ``Params`` class below: its fields are its ``PARAMS``' keys, in
order, checked when the class is declared), so mypy checks every handler's use of them; the request is
parsed once, by the entrance (``sessionmem_proxy.routes``), into that object."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from functools import partial
from typing import Any, ClassVar, Literal, Protocol, TypeVar

import orjson
from pydantic import BaseModel

from sessionmem_core import api, env, wire
from sessionmem_core.errors import InvalidRequest
from sessionmem_core.keys import Scope
from sessionmem_infra.serving import Reply, array_body, memory_reply, not_modified_reply
from sessionmem_proxy.admission import AgentIdentity, Operation, ProxyContext, conversation_operation
from sessionmem_proxy.redaction import strings_of, with_strings
from sessionmem_proxy.store import EntryToStore, NewEntry

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


def bounded_header(key: str, name: str, min_length: int, max_length: int, pattern: str, description: str) -> Param:
    """A header whose value is checked (typed 400 naming it): its length and its characters."""
    checked = replace(text(key, name, min_length=min_length, max_length=max_length, pattern=pattern), required=False)
    schema = {"type": "string", "minLength": min_length, "maxLength": max_length, "pattern": f"^{pattern}$"}

    def parse(raw: str) -> str:
        try:
            return str(checked.parse(raw))
        except InvalidRequest as exc:
            raise InvalidRequest(str(exc).replace(f"query.{name}", f"header.{name}")) from exc

    return Param(key, name, "header", schema, parse, None, description=description)


def _identity(raw: str) -> str:
    return raw  # validated by the operation itself (sessionmem_core.keys), inside its span


def from_contract(op: str, name: str, key: str | None = None) -> Param:
    """The parser of a parameter a memory operation declares in the contract (``api.MEMORY_OPERATIONS``),
    with the bounds, default and description declared there; ``key``: the name a handler reads it under
    (its wire name unless given)."""
    (spec,) = [p for p in api.MEMORY_OPERATION[op].params if p.name == name]
    key, schema = key or name, spec.schema
    if spec.location == "header" and "pattern" in schema:
        return bounded_header(
            key,
            spec.name,
            schema["minLength"],
            schema["maxLength"],
            schema["pattern"].removeprefix("^").removesuffix("$"),
            spec.description,
        )
    if spec.location == "header":
        return header(key, spec.name, spec.description)
    if schema["type"] == "integer":
        return integer(key, spec.name, schema["default"], schema["minimum"], schema["maximum"], spec.description)
    if schema["type"] == "boolean":
        return boolean(key, schema["default"], spec.description)
    pattern = schema.get("pattern")
    return text(
        key,
        spec.name,
        default=schema.get("default"),
        min_length=schema.get("minLength", 0),
        max_length=schema.get("maxLength", 1024),
        pattern=pattern.removeprefix("^").removesuffix("$") if pattern else None,
        description=spec.description,
    )


# --- the parameters the routes share ---
CONVERSATION_ID = Param(
    "conversation_id",
    api.CONVERSATION_ID.name,
    "path",
    api.CONVERSATION_ID.schema,
    _identity,
    required=True,
    description=api.CONVERSATION_ID.description,
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
READ_LIMIT = from_contract("get", api.LIMIT_PARAM)
EXPORT_OFFSET = integer(
    "offset", api.OFFSET_PARAM, 0, 0, 1 << 31, "Where this export page starts (the nextOffset of the page before)"
)
SUMMARY = from_contract("get", "summary")
AUTHORIZATION = header("authorization", "authorization", "Bearer token of the calling agent")
CAPABILITY = header("capability", api.USER_CAPABILITY_HEADER, "The end user's signed run capability (perUser)")
TRACEPARENT = header("traceparent", api.TRACEPARENT_HEADER, documented=False)
IF_MATCH = from_contract("replace", api.IF_MATCH_HEADER, "if_match")


def parse_if_match(if_match: str | None) -> int | None:
    """The version a conditional write expects (``If-Match``: a version as a read reports it, bare or
    quoted as an entity tag), or None for any (absent, empty or ``*``)."""
    if if_match is None or if_match.strip() in ("", "*"):
        return None
    value = if_match.strip().removeprefix("W/").strip('"')
    if not (value.isascii() and value.isdigit()):
        raise InvalidRequest("If-Match must be a version number, or '*'")
    return int(value)


IDEMPOTENCY_KEY = from_contract("append", api.IDEMPOTENCY_KEY_HEADER, "idempotency_key")
IF_NONE_MATCH = from_contract("get", api.IF_NONE_MATCH_HEADER, "if_none_match")
PREFER = from_contract("append", api.PREFER_HEADER)

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


class Params(Protocol):
    """A route's parameter set: the declarations it is parsed from (``PARAMS``), one field per key."""

    PARAMS: ClassVar[tuple[Param, ...]]


P = TypeVar("P", bound=Params)


def parse(kind: type[P], request: RawRequest) -> P:
    """The request's parameters as ``kind``, each parsed by its declaration (typed 400 otherwise)."""
    values: list[Any] = []
    for param in kind.PARAMS:
        if param.location == "path":
            raw = request.path_values.get(param.name)
        elif param.location == "query":
            raw = request.query.get(param.name)
        else:
            raw = request.headers.get(param.name)
        # Most optional parameters are absent from most requests: their default without a call.
        values.append(param.default if raw is None and not param.required else param.value(raw))
    return kind(*values)


C = TypeVar("C")


def declared(cls: C) -> C:
    """Check, once, that a parameter set's fields are its ``PARAMS``' keys in order (besides keyword-only
    fields, which the app sets itself): the declaration and the class cannot drift apart."""
    keys = [param.key for param in cls.PARAMS]  # type: ignore[attr-defined]
    parsed = [f.name for f in fields(cls) if not f.kw_only][: len(keys)]  # type: ignore[arg-type]
    if parsed != keys:
        raise TypeError(f"{cls.__name__} fields {parsed} are not its PARAMS {keys}")  # type: ignore[attr-defined]
    return cls


# --- the parameter sets of the routes ---

LIST_LIMIT = from_contract("list", api.LIMIT_PARAM)
CURSOR = from_contract("list", "cursor")
ADMIN_CURSOR = text(
    "cursor",
    "cursor",
    default="0",
    min_length=1,
    max_length=20,
    pattern="[0-9]{1,20}",
    description="Where the page starts (the nextCursor of the page before)",
)
SEARCH_Q = from_contract("search", "q")
SEARCH_LIMIT = from_contract("search", api.LIMIT_PARAM)
CONFIRM = from_contract("clear", "confirm")
# An administrator's reads: an end user's bucket named by the user (or by the bucket a listing showed).
ADMIN_USER = replace(
    text("user", api.ADMIN_USER_QUERY, max_length=256, description="Only this end user's bucket"),
    required=False,
)
ADMIN_BUCKET = replace(
    text(
        "bucket", api.ADMIN_BUCKET_QUERY, min_length=32, max_length=32, pattern="[0-9a-f]{32}",
        description="Only this user bucket (as a listing shows it)",
    ),
    required=False,
)  # fmt: skip
ADMIN_CONVERSATION = replace(
    text("conversation", api.ADMIN_CONVERSATION_QUERY, max_length=128, description="Only this conversation"),
    required=False,
)
ADMIN_EXPORTED = text(
    "conversation", api.ADMIN_CONVERSATION_QUERY, max_length=128, description="The conversation to export"
)
ADMIN_LIST_LIMIT = integer("limit", "limit", 50, 1, 200, "Page size hint (Valkey SCAN)")
ADMIN_LAST = integer("last", api.ADMIN_LAST_QUERY, env.DEFAULT_CAP, 1, env.MAX_CAP, "How many of the newest entries")
ADMIN_SPACE = (*ADMIN, ADMIN_USER, ADMIN_BUCKET)


@declared
@dataclass(slots=True)
class NoParams:
    PARAMS: ClassVar[tuple[Param, ...]] = ()


@declared
@dataclass(slots=True)
class ConversationParams:
    """An operation on one conversation (info), and what every other one takes besides its own (the sets
    below extend it); ``verified``: the caller, when the app verified it before reading the body (the
    operation then does not verify the same token again)."""

    PARAMS: ClassVar[tuple[Param, ...]] = CONVERSATION
    conversation_id: str
    scope: Scope
    authorization: str | None
    traceparent: str | None
    capability: str | None
    verified: AgentIdentity | None = field(default=None, kw_only=True)


@declared
@dataclass(slots=True)
class ReadParams(ConversationParams):
    PARAMS: ClassVar[tuple[Param, ...]] = (*CONVERSATION, READ_LIMIT, SUMMARY, IF_NONE_MATCH)
    limit: int
    summary: bool
    if_none_match: str | None


@declared
@dataclass(slots=True)
class AppendParams(ConversationParams):
    PARAMS: ClassVar[tuple[Param, ...]] = (*CONVERSATION, *WRITE, IDEMPOTENCY_KEY, IF_MATCH, PREFER)
    cap: int
    ttl_seconds: int
    redact: str
    idempotency_key: str | None
    if_match: str | None
    prefer: str | None


@declared
@dataclass(slots=True)
class ReplaceParams(ConversationParams):
    PARAMS: ClassVar[tuple[Param, ...]] = (*CONVERSATION, *WRITE, IF_MATCH)
    cap: int
    ttl_seconds: int
    redact: str
    if_match: str | None


@declared
@dataclass(slots=True)
class ConditionalParams(ConversationParams):
    """An operation on one conversation conditional on its version (delete, pop, rewind)."""

    PARAMS: ClassVar[tuple[Param, ...]] = (*CONVERSATION, IF_MATCH)
    if_match: str | None


@declared
@dataclass(slots=True)
class CompactParams(ConversationParams):
    PARAMS: ClassVar[tuple[Param, ...]] = (*CONVERSATION, REDACT)
    redact: str


@declared
@dataclass(slots=True)
class ForkParams(ConversationParams):
    PARAMS: ClassVar[tuple[Param, ...]] = (*CONVERSATION, CAP, TTL)
    cap: int
    ttl_seconds: int


@declared
@dataclass(slots=True)
class SearchParams(ConversationParams):
    PARAMS: ClassVar[tuple[Param, ...]] = (*CONVERSATION, SEARCH_Q, SEARCH_LIMIT)
    q: str
    limit: int


@declared
@dataclass(slots=True)
class ExportParams(ConversationParams):
    PARAMS: ClassVar[tuple[Param, ...]] = (*CONVERSATION, EXPORT_OFFSET, IF_NONE_MATCH)
    offset: int
    if_none_match: str | None


@declared
@dataclass(slots=True)
class ListParams:
    PARAMS: ClassVar[tuple[Param, ...]] = (LIST_LIMIT, CURSOR, SCOPE, *CALLER, CAPABILITY)
    limit: int
    cursor: str
    scope: Scope
    authorization: str | None
    traceparent: str | None
    capability: str | None


@declared
@dataclass(slots=True)
class ClearParams:
    PARAMS: ClassVar[tuple[Param, ...]] = (CONFIRM, *CALLER)
    confirm: bool
    authorization: str | None
    traceparent: str | None


@declared
@dataclass(slots=True)
class EraseUserParams:
    PARAMS: ClassVar[tuple[Param, ...]] = (*CALLER, CAPABILITY)
    authorization: str | None
    traceparent: str | None
    capability: str | None


@declared
@dataclass(slots=True)
class AdminParams:
    """An administrator's operation on one agent's memory."""

    PARAMS: ClassVar[tuple[Param, ...]] = ADMIN
    namespace: str
    agent: str
    authorization: str | None
    traceparent: str | None


@declared
@dataclass(slots=True)
class AdminSpaceParams(AdminParams):
    """An administrator's operation on one agent's memory, or on one user bucket of it."""

    PARAMS: ClassVar[tuple[Param, ...]] = ADMIN_SPACE
    user: str | None
    bucket: str | None


@declared
@dataclass(slots=True)
class AdminUserParams(AdminParams):
    PARAMS: ClassVar[tuple[Param, ...]] = (*ADMIN, USER)
    user: str


@declared
@dataclass(slots=True)
class AdminNamespaceUserParams:
    PARAMS: ClassVar[tuple[Param, ...]] = (NAMESPACE, USER, ADMIN_AUTHORIZATION, TRACEPARENT)
    namespace: str
    user: str
    authorization: str | None
    traceparent: str | None


@declared
@dataclass(slots=True)
class AdminRegistryParams:
    PARAMS: ClassVar[tuple[Param, ...]] = (REGISTRY, ADMIN_AUTHORIZATION, TRACEPARENT)
    registry: str
    authorization: str | None
    traceparent: str | None


@declared
@dataclass(slots=True)
class AdminListParams(AdminSpaceParams):
    PARAMS: ClassVar[tuple[Param, ...]] = (*ADMIN_SPACE, ADMIN_LIST_LIMIT, ADMIN_CURSOR)
    limit: int
    cursor: str


@declared
@dataclass(slots=True)
class AdminShowParams(AdminSpaceParams):
    PARAMS: ClassVar[tuple[Param, ...]] = (*ADMIN_SPACE, CONVERSATION_ID, ADMIN_LAST)
    conversation_id: str
    last: int


@declared
@dataclass(slots=True)
class AdminConversationParams(AdminSpaceParams):
    PARAMS: ClassVar[tuple[Param, ...]] = (*ADMIN_SPACE, CONVERSATION_ID)
    conversation_id: str


@declared
@dataclass(slots=True)
class AdminExportParams(AdminSpaceParams):
    PARAMS: ClassVar[tuple[Param, ...]] = (*ADMIN_SPACE, ADMIN_EXPORTED, EXPORT_OFFSET)
    conversation: str
    offset: int


# --- The two operations of every agent turn: reading the window and appending the exchange.
#
# Handlers take the proxy's context, their typed parameters as the app parsed them (``sessionmem_proxy.operations``)
# and the validated body, and return a reply (``sessionmem_infra.serving``).


def operation(ctx: ProxyContext, op: str, p: ConversationParams) -> conversation_operation:
    """The operation on the conversation a request names, from the parameters every such route takes."""
    return conversation_operation(
        ctx, op, p.conversation_id, p.scope, p.authorization, p.capability, p.traceparent, p.verified
    )


async def new_entries(
    ctx: ProxyContext, op: Operation, entries: Sequence[wire.EntryIn], redact: str
) -> Sequence[EntryToStore]:
    """The entries to store: the request's own, or redacted copies when the request asks for redaction,
    which covers each entry's content and every string value inside its item. The redaction's CPU time is
    charged to the agent's transfer rate (``Quotas.charge_cpu``): it is work the proxy does for that agent
    alone, which its body size does not measure (card-like digits cost about a CPU-second per 0.75 MiB)."""
    redactor = ctx.redaction.chain(redact.split(",")) if redact else None
    if redactor is None:
        return entries
    texts: list[str] = []
    for entry in entries:
        texts.append(entry.content)
        if entry.item is not None:
            strings_of(entry.item, texts)
    redacted_texts, cpu_seconds = await ctx.redaction.apply(redactor, texts)
    ctx.quotas.charge_cpu(op.identity.owner, op.limits, cpu_seconds)
    redacted = iter(redacted_texts)
    copies: list[EntryToStore] = []
    for entry in entries:
        content = next(redacted)
        item = None if entry.item is None else with_strings(entry.item, redacted)
        copies.append(NewEntry(role=entry.role, content=content, id=entry.id, item=item))
    return copies


async def read_entries(ctx: ProxyContext, p: ReadParams, _: BaseModel | None) -> Reply:
    """The window: a window too large for the store's script is read apart, on one of the few Valkey
    connections a worker reads such answers on, and counts with the agent's exports and searches
    (``Quotas.open_stream``), so one agent's burst of big reads never takes them all."""
    async with operation(ctx, "get", p) as op:
        limit = p.limit
        store = ctx.store
        big = partial(ctx.quotas.open_stream, op.identity.owner)
        result = await (store.read_with_summary(op.key, limit, big) if p.summary else store.read(op.key, limit, big))
        op.span.entries, op.span.version = len(result.raw_entries), result.version
        # A read with the summary has no ETag: recording a summary leaves the version as it is.
        etag = None if p.summary or result.life is None else api.etag(result.life, result.version)
        if etag is not None and p.if_none_match == etag:
            return not_modified_reply(etag, op.scope, result.version)
        head = b'{"conversationId":%s,"scope":"%s","version":%d,"entries":[' % (
            orjson.dumps(op.conversation),
            op.scope.encode(),
            result.version,
        )
        tail = b'],"summary":' + result.raw_summary + b"}" if result.raw_summary else b"]}"
        body = array_body(head, result.raw_entries, tail)
        ctx.quotas.charge(op.identity.owner, len(body))
        return memory_reply(body, op.scope, len(result.raw_entries), result.version, etag)


async def append_entries(ctx: ProxyContext, p: AppendParams, body: BaseModel | None) -> Reply:
    assert isinstance(body, wire.AppendRequest)  # the route table validated it
    expected = None if p.if_match is None else parse_if_match(p.if_match)
    async with operation(ctx, "append", p) as op:
        result = await ctx.store.append(
            op.key,
            await new_entries(ctx, op, body.entries, p.redact),
            author=op.identity.owner.author,
            cap=p.cap,
            ttl_seconds=p.ttl_seconds,
            quota=op.limits,
            idempotency_key=p.idempotency_key,
            expected_version=expected,
            represent=p.prefer == api.RETURN_REPRESENTATION,
        )
        op.span.entries, op.span.version = result.stored, result.version
        duplicate = b"true" if result.duplicate else b"false"
        stored = result.raw_entries
        return memory_reply(
            b'{"version":%d,"stored":%d,"duplicate":%s,"scope":"%s","length":%d,"duplicateIds":%s%s}'
            % (
                result.version,
                result.stored,
                duplicate,
                op.scope.encode(),
                result.length,
                orjson.dumps(result.duplicate_ids) if result.duplicate_ids else b"[]",
                b"" if stored is None else b',"entries":[' + b",".join(stored) + b"]",
            ),
            op.scope,
            result.stored,
            result.version,
            # The state right after this append, which the stored entries complete (only when they are answered).
            None if stored is None or result.life is None else api.etag(result.life, result.version),
        )
