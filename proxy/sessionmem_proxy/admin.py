"""The administrators' routes (who may call them: ``rbac``). Administration of memory (inspect, export,
erase an agent's or a user's memory) is a person's act, authorised by Kubernetes RBAC: never an agent
token's.

The caller presents their own Kubernetes bearer token (what kubectl sends). The proxy asks the API server
who it is (TokenReview under the API server's own audiences, not the proxy's: an agent's projected token
is not for those) and whether that person may act on the ``memory`` subresource of the AgentDeployment
(SubjectAccessReview: ``get`` to read, ``list`` to enumerate, ``delete`` to erase). Cluster operators grant
it with an ordinary Role, e.g. ``resources: [agentdeployments/memory], verbs: [get, list, delete]``.

Fail closed at every decision point: no or unknown token 401, an agent's own token or a person without the
permission 403, an API server that cannot be asked 503.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import orjson
from pydantic import BaseModel

from sessionmem_core import api, kube, wire
from sessionmem_core.errors import Forbidden, InvalidRequest, NotFound, SessionMemError
from sessionmem_core.keys import (
    Owner,
    agent_of,
    agent_space,
    bucket_and_conversation,
    bucket_space,
    conversation_key,
    keys_under,
    parse_conversation_id,
    registry_space,
    user_bucket_keys,
)
from sessionmem_infra.serving import Reply, model_reply
from sessionmem_proxy.admission import bearer_token
from sessionmem_proxy.bulk import erase_space, export_page
from sessionmem_proxy.operations import (
    AdminConversationParams,
    AdminExportParams,
    AdminListParams,
    AdminNamespaceUserParams,
    AdminParams,
    AdminRegistryParams,
    AdminShowParams,
    AdminSpaceParams,
    AdminUserParams,
    P,
)
from sessionmem_proxy.rbac import ERASE, LIST, READ, Administrator

if TYPE_CHECKING:
    from sessionmem_proxy.admission import ProxyContext

_AUDIT = logging.getLogger("sessionmem.proxy.audit")
# A conversation of a space, to read the space's accounting by (it is kept per space, not per conversation).
_ANY_CONVERSATION = parse_conversation_id("stats")

_Handler = Callable[["ProxyContext", P, BaseModel | None], Awaitable[Reply]]
_NDJSON_HEADER = ("content-type", api.NDJSON)


def observed(op: str) -> Callable[[_Handler[P]], _Handler[P]]:
    """Counts an administrator's operation in the proxy's metrics (``op``, and ``ok`` or its typed error),
    as the agents' operations are counted."""

    def wrap(handler: _Handler[P]) -> _Handler[P]:
        @functools.wraps(handler)
        async def counted(ctx: ProxyContext, p: P, body: BaseModel | None) -> Reply:
            started, outcome = time.perf_counter(), "internal"
            try:
                answer = await handler(ctx, p, body)
                outcome = "ok"
                return answer
            except SessionMemError as exc:
                outcome = exc.error_type
                raise
            finally:
                ctx.metrics.observe(op, outcome, (time.perf_counter() - started) * 1000.0)

        return counted

    return wrap


@observed("admin_erase_agent")
async def erase_agent_memory(ctx: ProxyContext, p: AdminParams, _: BaseModel | None) -> Reply:
    """Every conversation of one agent, its users' buckets included: for a person allowed to delete the
    memory of that AgentDeployment."""
    owner = Owner(p.namespace, p.agent)
    return await _erase(ctx, p, agent_space(owner), owner.namespace, owner.agent, kube.AGENT_PLURAL)


@observed("admin_erase_user")
async def erase_user_memory(ctx: ProxyContext, p: AdminUserParams, _: BaseModel | None) -> Reply:
    """One end user's conversations with one agent (their bucket), for a person allowed to delete the
    memory of that AgentDeployment. The bucket is derived as the proxy derives it for the user's turns."""
    owner = Owner(p.namespace, p.agent)
    prefix = ctx.keys.bucket_prefix(owner, p.user)
    return await _erase(ctx, p, prefix, owner.namespace, owner.agent, kube.AGENT_PLURAL, user=p.user)


@observed("admin_erase_user_everywhere")
async def erase_user_everywhere(ctx: ProxyContext, p: AdminNamespaceUserParams, _: BaseModel | None) -> Reply:
    """One end user's conversations with every agent of a namespace, for a person allowed to delete the
    memory of all the namespace's AgentDeployments. The user's buckets are found by the agents that keep
    per-user memory there (their bucket keys), each derived as the proxy derives it for the user's turns."""
    namespace, user = p.namespace, p.user
    if ctx.admin is None:
        raise Forbidden("memory administration is not enabled on this proxy")
    admin = await ctx.admin.authorize(bearer_token(p.authorization), ERASE, namespace, None)
    agents: set[str] = set()
    cursor = 0
    while True:
        cursor, keys = await ctx.store.scan(user_bucket_keys(namespace), cursor, 500)
        agents.update(agent_of(namespace, key) for key in keys)
        if cursor == 0:
            break
    removed: list[str] = []
    entries = 0
    destroyed: list[str] | None = None
    with ctx.tracer.span("admin_erase", "", p.traceparent) as span:
        for agent in sorted(agents):
            erased = await erase_space(ctx.store, ctx.keys.bucket_prefix(Owner(namespace, agent), user))
            removed += erased.keys
            entries += erased.entries
            if erased.data_keys_destroyed is not None:
                destroyed = (destroyed or []) + erased.data_keys_destroyed
        span.entries = entries
    _AUDIT.warning(
        "memory of one user with every agent of %s erased by %s: %d keys, %d entries",
        namespace,
        admin.username,
        len(removed),
        entries,
    )
    return model_reply(
        wire.ErasureReceipt(
            namespace=namespace,
            agent="",
            user=user,
            keys=sorted(removed),
            entries=entries,
            erasedBy=admin.username,
            dataKeysDestroyed=sorted(destroyed) if destroyed is not None else None,
        )
    )


@observed("admin_erase_registry")
async def erase_registry_memory(ctx: ProxyContext, p: AdminRegistryParams, _: BaseModel | None) -> Reply:
    """Every shared conversation of one AgentRegistry's team: its members append and read them, but
    replacing or erasing them is a person's act (delete on agentregistries/memory, cluster-scoped)."""
    prefix = registry_space(p.registry)  # a typed 400 for a name that is not a DNS label
    return await _erase(ctx, p, prefix, "", p.registry, kube.REGISTRY_PLURAL)


async def _erase(
    ctx: ProxyContext,
    p: AdminParams | AdminRegistryParams,
    prefix: str,
    namespace: str,
    name: str,
    resource: str,
    user: str | None = None,
) -> Reply:
    if ctx.admin is None:
        raise Forbidden("memory administration is not enabled on this proxy")
    admin = await ctx.admin.authorize(bearer_token(p.authorization), ERASE, namespace, name, resource)
    with ctx.tracer.span("admin_erase", "", p.traceparent) as span:
        erased = await erase_space(ctx.store, prefix)
        removed, entries = erased.keys, erased.entries
        span.entries = entries
    target = f"{namespace}/{name}" if namespace else f"registry {name}"
    _AUDIT.warning(
        "memory of %s%s erased by %s: %d keys, %d entries",
        target,
        " (one user)" if user is not None else "",
        admin.username,
        len(removed),
        entries,
    )
    registry = name if resource == kube.REGISTRY_PLURAL else None
    return model_reply(
        wire.ErasureReceipt(
            namespace=namespace,
            agent="" if registry else name,
            user=user,
            registry=registry,
            keys=sorted(removed),
            entries=entries,
            erasedBy=admin.username,
            dataKeysDestroyed=erased.data_keys_destroyed,
        )
    )


# --- Reading an agent's memory (kubectl sessionmem): get/list on agentdeployments/memory ---

# The stats examine at most this many conversations for their oldest and newest writes (two reads each),
# so one request stays bounded however many conversations the agent has; the answer says when it stopped.
STATS_EXAMINED_CONVERSATIONS = 500
_SCAN_BATCH = 200
# A listing page scans at most this many batches, so one request stays bounded however sparse the keyspace.
_MAX_SCANS_PER_PAGE = 50


async def _authorized_space(ctx: ProxyContext, p: AdminParams, verb: str) -> tuple[Owner, str, Administrator]:
    """(owner, key prefix of the space asked for, administrator): the agent's whole private space, or one
    end user's bucket in it (``user``, derived as for the user's own turns; or the ``bucket`` a listing
    showed). Parameters that cannot name a user (not ``AdminSpaceParams``) name the whole space."""
    owner = Owner(p.namespace, p.agent)
    if ctx.admin is None:
        raise Forbidden("memory administration is not enabled on this proxy")
    admin = await ctx.admin.authorize(bearer_token(p.authorization), verb, owner.namespace, owner.agent)
    user, bucket = (p.user, p.bucket) if isinstance(p, AdminSpaceParams) else (None, None)
    if user is not None and bucket is not None:
        raise InvalidRequest("name the end user or their bucket, not both")
    if user is not None:
        return owner, ctx.keys.bucket_prefix(owner, user), admin
    if bucket is not None:
        return owner, bucket_space(owner, bucket), admin
    return owner, agent_space(owner), admin


def _timestamp(raw: list[bytes]) -> int | None:
    if not raw:
        return None
    ts = orjson.loads(raw[0]).get("ts")
    return int(ts) if isinstance(ts, int) else None


@observed("admin_conversations")
async def list_agent_conversations(ctx: ProxyContext, p: AdminListParams, _: BaseModel | None) -> Reply:
    """One page of an agent's conversations (its users' buckets included, unless one user is named), each
    with its size, version, remaining TTL and last write."""
    cursor = int(p.cursor)
    if cursor >= 2**64:
        raise InvalidRequest("cursor is not one this server returned")
    owner, prefix, _admin = await _authorized_space(ctx, p, LIST)
    with ctx.tracer.span("admin_list", "", p.traceparent) as span:
        found: list[str] = []
        for _page in range(_MAX_SCANS_PER_PAGE):
            cursor, keys = await ctx.store.scan(keys_under(prefix), cursor, max(1, p.limit - len(found)))
            found += keys
            if cursor == 0 or len(found) >= p.limit:
                break
        conversations: list[wire.AdminConversation] = []
        for key in sorted(set(found)):
            parsed = bucket_and_conversation(owner, key)
            if parsed is None:
                continue
            length, version, ttl = await ctx.store.info(key)
            if not length:
                continue  # expired or erased since the scan saw it
            newest = _timestamp(await ctx.store.read_range(key, -1, -1))
            conversations.append(
                wire.AdminConversation(
                    conversationId=parsed[1],
                    bucket=parsed[0],
                    entries=length,
                    version=version,
                    ttlSeconds=ttl,
                    newestTs=newest,
                )
            )
        span.entries = len(conversations)
    return model_reply(
        wire.AdminConversationList(
            namespace=owner.namespace,
            agent=owner.agent,
            user=p.user,
            conversations=conversations,
            nextCursor=str(cursor) if cursor else None,
        )
    )


@observed("admin_show")
async def show_conversation(ctx: ProxyContext, p: AdminShowParams, _: BaseModel | None) -> Reply:
    """The newest ``last`` entries of one conversation, oldest first, with their authors and times."""
    owner, prefix, _admin = await _authorized_space(ctx, p, READ)
    key = conversation_key(prefix, parse_conversation_id(p.conversation_id))
    with ctx.tracer.span("admin_show", p.conversation_id, p.traceparent) as span:
        length, version, ttl = await ctx.store.info(key)
        if not length:
            raise NotFound(f"{owner.author} has no conversation {p.conversation_id!r} there")
        result = await ctx.store.read(key, p.last)
        span.entries, span.version = len(result.raw_entries), version
    parsed = bucket_and_conversation(owner, key)
    return model_reply(
        wire.Transcript(
            namespace=owner.namespace,
            agent=owner.agent,
            conversationId=p.conversation_id,
            bucket=parsed[0] if parsed else None,
            version=version,
            total=length,
            ttlSeconds=ttl,
            entries=[wire.Entry.model_validate_json(raw) for raw in result.raw_entries],
        )
    )


@observed("admin_export")
async def export_conversation(ctx: ProxyContext, p: AdminExportParams, _: BaseModel | None) -> Reply:
    """One page of one conversation as JSON lines, one per entry (``conversationId`` and ``bucket`` added
    to the stored entry), oldest first; the ``x-sessionmem-next-offset`` header says where the next page
    starts, absent on the last. An agent's or a user's whole memory is the pages of each conversation its
    listing shows (``kubectl sessionmem export`` does that)."""
    owner, prefix, _admin = await _authorized_space(ctx, p, READ)
    conversation_id = p.conversation
    key = conversation_key(prefix, parse_conversation_id(conversation_id))
    with ctx.tracer.span("admin_export", conversation_id, p.traceparent) as span:
        exported = await export_page(ctx.store, key, p.offset)
        if not exported.length:
            raise NotFound(f"there is no conversation {conversation_id!r} there")
        page, next_offset = exported.raw_entries, exported.next_offset
        span.entries = len(page)
    bucket = bucket_and_conversation(owner, key)
    head = (
        b'{"conversationId":'
        + orjson.dumps(conversation_id)
        + b',"bucket":'
        + orjson.dumps(bucket[0] if bucket else None)
        + b","
    )
    # A stored entry is a JSON object beginning '{"id":': the extra fields go in front of its own.
    body = b"".join(head + raw[1:] + b"\n" for raw in page)
    headers = [_NDJSON_HEADER]
    if next_offset is not None:
        headers.append((api.NEXT_OFFSET_HEADER, str(next_offset)))
    return Reply(200, headers, body)


@observed("admin_stats")
async def agent_memory_stats(ctx: ProxyContext, p: AdminParams, _: BaseModel | None) -> Reply:
    """Conversations and bytes against the agent's quotas (the storage accounting's figures), and the oldest
    and newest writes among at most STATS_EXAMINED_CONVERSATIONS of its conversations."""
    owner, prefix, _admin = await _authorized_space(ctx, p, READ)  # no user named: the agent's whole space
    with ctx.tracer.span("admin_stats", "", p.traceparent) as span:
        oldest: int | None = None
        newest: int | None = None
        examined, counted, cursor = 0, 0, 0
        while examined < STATS_EXAMINED_CONVERSATIONS:
            cursor, keys = await ctx.store.scan(keys_under(prefix), cursor, _SCAN_BATCH)
            for key in keys:
                if examined >= STATS_EXAMINED_CONVERSATIONS or bucket_and_conversation(owner, key) is None:
                    continue
                first = _timestamp(await ctx.store.read_range(key, 0, 0))
                last = _timestamp(await ctx.store.read_range(key, -1, -1))
                examined += 1
                if first is not None:
                    oldest = first if oldest is None else min(oldest, first)
                if last is not None:
                    newest = last if newest is None else max(newest, last)
            counted += len(keys)
            if cursor == 0:
                break
        ledger = ctx.store.ledger
        usage = await ledger.peek(conversation_key(prefix, _ANY_CONVERSATION)) if ledger is not None else None
        limits = await ctx.quotas.policy_of(owner)
        span.entries = examined
    return model_reply(
        wire.AgentMemoryStats(
            namespace=owner.namespace,
            agent=owner.agent,
            conversations=usage.conversations if usage is not None else counted,
            bytes=usage.bytes if usage is not None else 0,
            quotaConversations=limits.max_conversations if limits is not None else None,
            quotaBytes=limits.max_bytes if limits is not None else None,
            perUser=limits.per_user if limits is not None else None,
            oldestWriteTs=oldest,
            newestWriteTs=newest,
            examined=examined,
            complete=cursor == 0,
        )
    )


@observed("admin_erase_conversation")
async def erase_conversation(ctx: ProxyContext, p: AdminConversationParams, _: BaseModel | None) -> Reply:
    """One conversation of an agent (in a user's bucket, when one is named): delete on the memory."""
    owner, prefix, admin = await _authorized_space(ctx, p, ERASE)
    key = conversation_key(prefix, parse_conversation_id(p.conversation_id))
    with ctx.tracer.span("admin_erase", p.conversation_id, p.traceparent) as span:
        entries = await ctx.store.delete(key)
        span.entries = entries
    _AUDIT.warning(
        "conversation %r of %s erased by %s: %d entries", p.conversation_id, owner.author, admin.username, entries
    )
    return model_reply(
        wire.ErasureReceipt(
            namespace=owner.namespace,
            agent=owner.agent,
            user=p.user,
            keys=[key] if entries else [],
            entries=entries,
            erasedBy=admin.username,
            # One conversation shares its data key with the rest of its agent's (or user's) memory: no key
            # is destroyed, so copies of it in the AOF or a backup stay readable until they roll.
            dataKeysDestroyed=[] if ctx.store.sealer is not None else None,
        )
    )
