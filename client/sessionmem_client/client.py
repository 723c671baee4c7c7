"""The memory API of the launcher (``http://127.0.0.1:2998`` inside an agent pod), sync and async.

The launcher adds the pod's identity, scope, cap and TTL itself, so a client sends no credentials. Every
method validates the conversation id with the contract's rule before any network call, returns the
contract's pydantic models and raises the contract's typed errors (``sessionmem_core.errors``): a
transport failure is :class:`~sessionmem_core.errors.BackendUnavailable`, an answer of 4xx/5xx is the
error the server raised (``VersionConflict`` for a stale ``If-Match``, ``InvalidConversationId``, ...).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from sessionmem_client._requests import (
    DEFAULT_READ_CACHE_BYTES,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_SECONDS,
    CallOptions,
    Convert,
    EntryFields,
    EntryLike,
    KeptRead,
    M,
    ReadCache,
    ReadKey,
    Reply,
    Request,
    Requests,
    WindowEntry,
    appended_entries,
    check_stored,
    decode,
    decode_entries,
    decode_window,
    default_base_url,
    exchange_entries,
    export_read,
    json_copy,
    retry_delay,
    window_read,
)
from sessionmem_client._transport import AsyncTransport, SyncTransport, async_transport, sync_transport
from sessionmem_core import api, env, wire

if TYPE_CHECKING:  # httpx is loaded only when the caller brings httpx pieces
    import httpx

__all__ = ["AsyncMemoryClient", "MemoryClient"]


def _as_they_are(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return entries


_Transport = TypeVar("_Transport", SyncTransport, AsyncTransport)


class _Client(Generic[_Transport]):
    """What the sync and the async client share: the options every call carries, and the transport."""

    def __init__(
        self,
        base_url: str | None,
        turn: str | None,
        traceparent: str | None,
        propagate_trace_context: bool,
        retries: int,
        read_cache_bytes: int,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be 0 or more (got {retries})")
        if read_cache_bytes < 0:
            raise ValueError(f"read_cache_bytes must be 0 or more (got {read_cache_bytes})")
        self._retries = retries
        # The adapters' reads, kept to be asked again conditionally (None: off).
        self._reads = ReadCache(read_cache_bytes) if read_cache_bytes else None
        self._options = CallOptions(
            base_url=base_url or default_base_url(),
            turn=turn,
            traceparent=traceparent,
            propagate_trace_context=propagate_trace_context,
        )
        self._owns_http = True

    _http: _Transport

    @property
    def base_url(self) -> str:
        return self._options.base_url

    @property
    def turn(self) -> str | None:
        return self._options.turn

    def with_turn(self, turn: str | None) -> Self:
        """A client for another turn (another request the agent serves) that shares this one's connection
        pool (closing it is a no-op)."""
        clone = copy.copy(self)
        clone._options = dataclasses.replace(self._options, turn=turn)
        clone._owns_http = False
        return clone

    # --- conditional reads of the framework adapters (``ReadCache``): the request, then the answer ---

    def _conditional(
        self, conversation_id: str, limit: int | None, keep: bool
    ) -> tuple[Request[wire.History], ReadKey | None, KeptRead | None]:
        """The read of ``limit`` entries (None: all, an export), sent with the ETag of the answer kept for it;
        with ``keep`` False, a plain read (neither kept nor sent conditionally)."""
        request = export_read(conversation_id) if limit is None else window_read(conversation_id, limit, False)
        if self._reads is None or not keep:
            return request, None, None
        key: ReadKey = (conversation_id, limit, self._options.turn)
        kept = self._reads.get(key)
        if kept is not None:
            request = dataclasses.replace(request, if_none_match=kept.etag)
        return request, key, kept

    def _answered(
        self,
        request: Request[wire.History],
        key: ReadKey | None,
        kept: KeptRead | None,
        reply: Reply,
        convert: Convert,
    ) -> tuple[list[Any], bool]:
        """``convert`` of the answer's entries, the kept answer's on a 304, else the new answer's (then kept);
        and whether the objects are the kept ones (the caller copies them before anyone may change them)."""
        if reply.status == api.NOT_MODIFIED and kept is not None:
            return kept.converted_by(convert), True
        entries = decode_entries(request, reply)
        if self._reads is not None and key is not None and reply.etag is not None and reply.status == 200:
            fresh = self._reads.put(key, reply.etag, entries, len(reply.body))
            if fresh is not None:
                return fresh.converted_by(convert), True
        return convert(entries), False

    def _prefer(self, conversation_id: str) -> str | None:
        """An append asks for its entries when a read of its conversation is kept, to move that read on."""
        reads = self._reads
        if reads is None or not reads.holds(conversation_id, self._options.turn):
            return None
        return api.RETURN_REPRESENTATION

    def _stored(self, conversation_id: str, request: Request[Any], reply: Reply) -> None:
        """After an append that answered its entries: the kept reads of its conversation moved on (or dropped)."""
        if self._reads is None or request.prefer is None:
            return
        answered = appended_entries(request, reply)
        if answered is None:
            self._reads.appended(conversation_id, self._options.turn, None, [], 0, 0)
            return
        stored, length = answered
        self._reads.appended(conversation_id, self._options.turn, reply.etag, stored, len(reply.body), length)


class MemoryClient(_Client[SyncTransport]):
    """Synchronous client, over pooled keep-alive connections; safe to share between threads.

    ``turn``: the handle of the end user's turn in flight (agents with ``perUser: true``): the value of the
    ``X-Sessionmem-Turn`` header of the request the launcher sent the agent, sent back as that header; good
    only until the agent answers that request. ``traceparent``: a W3C trace context sent with every call
    (a per-call ``traceparent=`` wins); without either, the active OpenTelemetry span is propagated when
    ``propagate_trace_context`` is true. ``timeout``: seconds to connect and for each send or receive.
    ``transport``/``http_client``: send through httpx instead, with your own transport or client (a
    client passed in is not closed by :meth:`close`). ``read_cache_bytes``: how much of the framework
    adapters' reads the client keeps to ask again conditionally (ETag, 304; 0: none), per client.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        turn: str | None = None,
        traceparent: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        propagate_trace_context: bool = True,
        transport: httpx.BaseTransport | None = None,
        http_client: httpx.Client | None = None,
        retries: int = DEFAULT_RETRIES,
        read_cache_bytes: int = DEFAULT_READ_CACHE_BYTES,
    ) -> None:
        super().__init__(base_url, turn, traceparent, propagate_trace_context, retries, read_cache_bytes)
        self._http = sync_transport(self._options.base_url, timeout, transport, http_client)

    def _call(self, request: Request[M]) -> Reply:
        """The answer to ``request``, sent again after a 429/503 as :func:`retry_delay` says."""
        reply = self._http.send(self._options, request)
        done = 0
        while reply.status >= 429:
            delay = retry_delay(request, reply, done, self._retries)
            if delay is None:
                break
            time.sleep(delay)
            done += 1
            reply = self._http.send(self._options, request)
        return reply

    def _send(self, request: Request[M]) -> M:
        return decode(request, self._call(request))

    def _read_window(self, conversation_id: str, limit: int, summary: bool) -> list[WindowEntry]:
        """:meth:`read` for the framework adapters: the entries without the History model around them."""
        request = window_read(conversation_id, limit, summary)
        return decode_window(request, self._call(request))

    def _append_batch(
        self,
        conversation_id: str,
        entries: list[EntryFields],
        idempotency_key: str | None = None,
        if_version: int | None = None,
    ) -> None:
        """:meth:`append` for the framework adapters: one batch, checked by the server, nothing returned
        (but the client's kept reads of the conversation moved on past it)."""
        request = Requests.append_batch(
            conversation_id, entries, idempotency_key, if_version, self._prefer(conversation_id)
        )
        reply = self._call(request)
        check_stored(request, reply)
        self._stored(conversation_id, request, reply)

    # --- one conversation ---

    def read(
        self,
        conversation_id: str,
        limit: int = env.DEFAULT_REPLAY_MESSAGES,
        summary: bool = False,
        *,
        traceparent: str | None = None,
    ) -> wire.History:
        """The last ``limit`` entries (0-500), oldest first, and the conversation version; with
        ``summary=True`` also the rolling summary of older turns, when there is one."""
        return self._send(Requests.read(conversation_id, limit, summary, traceparent))

    def append(
        self,
        conversation_id: str,
        entries: Iterable[EntryLike],
        if_version: int | None = None,
        *,
        traceparent: str | None = None,
    ) -> wire.AppendResponse:
        """Append 1-64 entries as one atomic step (push, trim to the cap, refresh the TTL). A batch whose
        first message id is already stored is a retry: nothing is stored, ``duplicate`` is true. With
        ``if_version`` it is conditional (``If-Match``): :class:`~sessionmem_core.errors.VersionConflict`,
        nothing stored, when the conversation is at another version (0: only where nothing is stored)."""
        return self._send(Requests.append(conversation_id, entries, traceparent, if_version))

    def append_exchange(
        self,
        conversation_id: str,
        user: str,
        assistant: str,
        turn_id: str | None = None,
        *,
        traceparent: str | None = None,
    ) -> wire.AppendResponse:
        """Store one {user, assistant} exchange with message ids ``<turn_id>-u`` / ``<turn_id>-a``: pass
        the same ``turn_id`` when retrying and the exchange is stored once (a fresh id when omitted)."""
        return self._send(Requests.append(conversation_id, exchange_entries(user, assistant, turn_id), traceparent))

    def replace(
        self,
        conversation_id: str,
        entries: Iterable[EntryLike],
        if_version: int | None = None,
        *,
        traceparent: str | None = None,
    ) -> wire.ReplaceResponse:
        """Replace (seed) the whole history. With ``if_version`` it is conditional (``If-Match``):
        :class:`~sessionmem_core.errors.VersionConflict` when the conversation has moved on."""
        return self._send(Requests.replace(conversation_id, entries, if_version, traceparent))

    def _read_entries(self, conversation_id: str, limit: int | None) -> list[dict[str, Any]]:
        """The latest ``limit`` entries (all when None, from an export) as the answer's JSON objects (the
        caller's own): what the framework adapters turn into their items."""
        entries, kept = self._read_converted(conversation_id, limit, _as_they_are)
        return json_copy(entries) if kept else entries

    def _read_converted(
        self, conversation_id: str, limit: int | None, convert: Convert, keep: bool = True
    ) -> tuple[list[Any], bool]:
        """``convert`` of the latest ``limit`` entries (all when None), asked conditionally: a 304 answers
        what ``convert`` made of the kept answer. A new list; with True, of the kept objects (the same as the
        last call's), which an adapter copies when its caller may change them. ``keep`` False: an adapter for
        which keeping the read costs more than it saves (measured: docs/client.md)."""
        request, key, kept = self._conditional(conversation_id, limit, keep)
        return self._answered(request, key, kept, self._call(request), convert)

    def delete(
        self, conversation_id: str, if_version: int | None = None, *, traceparent: str | None = None
    ) -> wire.DeleteResponse:
        """Erase the conversation; with ``if_version`` only if it is still at that version
        (:class:`~sessionmem_core.errors.VersionConflict` otherwise)."""
        return self._send(Requests.delete(conversation_id, traceparent, if_version))

    def pop(
        self, conversation_id: str, if_version: int | None = None, *, traceparent: str | None = None
    ) -> wire.PopResponse:
        """Remove the newest entry atomically and answer it (``entry`` is None when there was none). A pop
        is a write: the version moves on. With ``if_version``: only if the conversation is at that version."""
        return self._send(Requests.pop(conversation_id, if_version, traceparent))

    def rewind(
        self, conversation_id: str, to_version: int, if_version: int | None = None, *, traceparent: str | None = None
    ) -> wire.RewindResponse:
        """Drop the entries written after ``to_version`` (an entry's ``v``); the version moves on."""
        return self._send(Requests.rewind(conversation_id, to_version, if_version, traceparent))

    def fork(
        self,
        conversation_id: str,
        new_conversation_id: str,
        at_version: int | None = None,
        *,
        traceparent: str | None = None,
    ) -> wire.ForkResponse:
        """Copy the entries written at or before ``at_version`` (all when None) into a new conversation of
        the same scope (and user bucket); :class:`~sessionmem_core.errors.ConversationExists` (409) when
        ``new_conversation_id`` is taken."""
        return self._send(Requests.fork(conversation_id, new_conversation_id, at_version, traceparent))

    def compact(
        self, conversation_id: str, summary: EntryLike, through_version: int, *, traceparent: str | None = None
    ) -> wire.CompactResponse:
        """Record ``summary`` as covering the entries written at or before ``through_version``, keeping them:
        a read with ``summary=True`` answers it and the entries after that version; an export answers all."""
        return self._send(Requests.compact(conversation_id, summary, through_version, traceparent))

    def search(
        self, conversation_id: str, q: str, limit: int = 10, *, traceparent: str | None = None
    ) -> wire.SearchResponse:
        """Keyword search within the conversation: entries ranked by matching terms, newest first on ties."""
        return self._send(Requests.search(conversation_id, q, limit, traceparent))

    def info(self, conversation_id: str, *, traceparent: str | None = None) -> wire.ConversationInfo:
        """Whether the conversation exists, its version, size and remaining TTL."""
        return self._send(Requests.info(conversation_id, traceparent))

    def export(self, conversation_id: str, *, traceparent: str | None = None) -> wire.History:
        """Every stored entry of the conversation (not just a window)."""
        return self._send(Requests.export(conversation_id, traceparent))

    # --- all of the agent's (or the user's) conversations ---

    def list_conversations(
        self, limit: int = 50, cursor: str | None = None, *, traceparent: str | None = None
    ) -> wire.ConversationList:
        """One page of this agent's conversation ids; pass ``next_cursor`` back for the next page."""
        return self._send(Requests.list_conversations(limit, cursor, traceparent))

    def set_metadata(
        self,
        conversation_id: str,
        *,
        title: str | None = None,
        labels: Mapping[str, str] | None = None,
        traceparent: str | None = None,
    ) -> wire.ConversationRef:
        """Set the catalogue's title and labels of a conversation (``NotFound`` when it is not listed)."""
        return self._send(Requests.set_metadata(conversation_id, title, labels, traceparent))

    def iter_conversations(self, page_size: int = 50, *, traceparent: str | None = None) -> Iterator[str]:
        """Every conversation id, page after page."""
        cursor: str | None = None
        while True:
            page = self.list_conversations(page_size, cursor, traceparent=traceparent)
            for ref in page.conversations:
                yield ref.conversation_id
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def erase_user(self, *, traceparent: str | None = None) -> wire.UserErasure:
        """Erase everything of the end user whose turn this client's ``turn`` is."""
        return self._send(Requests.erase_user(traceparent))

    # --- lifetime ---

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncMemoryClient(_Client[AsyncTransport]):
    """Asynchronous client; the same methods as :class:`MemoryClient`, awaited. ``timeout`` here bounds
    each attempt of a call (connect, send, answer) whatever the connection's past. Connections belong to the
    event loop that opened them; used from another loop (``asyncio.run`` again, ``Runner.run_sync``), the
    client opens new ones there, so one client serves any loop."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        turn: str | None = None,
        traceparent: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        propagate_trace_context: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        http_client: httpx.AsyncClient | None = None,
        retries: int = DEFAULT_RETRIES,
        read_cache_bytes: int = DEFAULT_READ_CACHE_BYTES,
    ) -> None:
        super().__init__(base_url, turn, traceparent, propagate_trace_context, retries, read_cache_bytes)
        self._http = async_transport(self._options.base_url, timeout, transport, http_client)

    async def _call(self, request: Request[M]) -> Reply:
        reply = await self._http.send(self._options, request)
        done = 0
        while reply.status >= 429:
            delay = retry_delay(request, reply, done, self._retries)
            if delay is None:
                break
            await asyncio.sleep(delay)
            done += 1
            reply = await self._http.send(self._options, request)
        return reply

    async def _send(self, request: Request[M]) -> M:
        return decode(request, await self._call(request))

    async def _read_window(self, conversation_id: str, limit: int, summary: bool) -> list[WindowEntry]:
        request = window_read(conversation_id, limit, summary)
        return decode_window(request, await self._call(request))

    async def _append_batch(
        self,
        conversation_id: str,
        entries: list[EntryFields],
        idempotency_key: str | None = None,
        if_version: int | None = None,
    ) -> None:
        request = Requests.append_batch(
            conversation_id, entries, idempotency_key, if_version, self._prefer(conversation_id)
        )
        reply = await self._call(request)
        check_stored(request, reply)
        self._stored(conversation_id, request, reply)

    async def read(
        self,
        conversation_id: str,
        limit: int = env.DEFAULT_REPLAY_MESSAGES,
        summary: bool = False,
        *,
        traceparent: str | None = None,
    ) -> wire.History:
        return await self._send(Requests.read(conversation_id, limit, summary, traceparent))

    async def append(
        self,
        conversation_id: str,
        entries: Iterable[EntryLike],
        if_version: int | None = None,
        *,
        traceparent: str | None = None,
    ) -> wire.AppendResponse:
        return await self._send(Requests.append(conversation_id, entries, traceparent, if_version))

    async def append_exchange(
        self,
        conversation_id: str,
        user: str,
        assistant: str,
        turn_id: str | None = None,
        *,
        traceparent: str | None = None,
    ) -> wire.AppendResponse:
        return await self._send(
            Requests.append(conversation_id, exchange_entries(user, assistant, turn_id), traceparent)
        )

    async def replace(
        self,
        conversation_id: str,
        entries: Iterable[EntryLike],
        if_version: int | None = None,
        *,
        traceparent: str | None = None,
    ) -> wire.ReplaceResponse:
        return await self._send(Requests.replace(conversation_id, entries, if_version, traceparent))

    async def _read_entries(self, conversation_id: str, limit: int | None) -> list[dict[str, Any]]:
        entries, kept = await self._read_converted(conversation_id, limit, _as_they_are)
        return json_copy(entries) if kept else entries

    async def _read_converted(
        self, conversation_id: str, limit: int | None, convert: Convert, keep: bool = True
    ) -> tuple[list[Any], bool]:
        request, key, kept = self._conditional(conversation_id, limit, keep)
        return self._answered(request, key, kept, await self._call(request), convert)

    async def delete(
        self, conversation_id: str, if_version: int | None = None, *, traceparent: str | None = None
    ) -> wire.DeleteResponse:
        return await self._send(Requests.delete(conversation_id, traceparent, if_version))

    async def pop(
        self, conversation_id: str, if_version: int | None = None, *, traceparent: str | None = None
    ) -> wire.PopResponse:
        return await self._send(Requests.pop(conversation_id, if_version, traceparent))

    async def rewind(
        self, conversation_id: str, to_version: int, if_version: int | None = None, *, traceparent: str | None = None
    ) -> wire.RewindResponse:
        return await self._send(Requests.rewind(conversation_id, to_version, if_version, traceparent))

    async def fork(
        self,
        conversation_id: str,
        new_conversation_id: str,
        at_version: int | None = None,
        *,
        traceparent: str | None = None,
    ) -> wire.ForkResponse:
        return await self._send(Requests.fork(conversation_id, new_conversation_id, at_version, traceparent))

    async def compact(
        self, conversation_id: str, summary: EntryLike, through_version: int, *, traceparent: str | None = None
    ) -> wire.CompactResponse:
        return await self._send(Requests.compact(conversation_id, summary, through_version, traceparent))

    async def search(
        self, conversation_id: str, q: str, limit: int = 10, *, traceparent: str | None = None
    ) -> wire.SearchResponse:
        return await self._send(Requests.search(conversation_id, q, limit, traceparent))

    async def info(self, conversation_id: str, *, traceparent: str | None = None) -> wire.ConversationInfo:
        return await self._send(Requests.info(conversation_id, traceparent))

    async def export(self, conversation_id: str, *, traceparent: str | None = None) -> wire.History:
        return await self._send(Requests.export(conversation_id, traceparent))

    async def list_conversations(
        self, limit: int = 50, cursor: str | None = None, *, traceparent: str | None = None
    ) -> wire.ConversationList:
        return await self._send(Requests.list_conversations(limit, cursor, traceparent))

    async def set_metadata(
        self,
        conversation_id: str,
        *,
        title: str | None = None,
        labels: Mapping[str, str] | None = None,
        traceparent: str | None = None,
    ) -> wire.ConversationRef:
        return await self._send(Requests.set_metadata(conversation_id, title, labels, traceparent))

    async def iter_conversations(self, page_size: int = 50, *, traceparent: str | None = None) -> AsyncIterator[str]:
        cursor: str | None = None
        while True:
            page = await self.list_conversations(page_size, cursor, traceparent=traceparent)
            for ref in page.conversations:
                yield ref.conversation_id
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def erase_user(self, *, traceparent: str | None = None) -> wire.UserErasure:
        return await self._send(Requests.erase_user(traceparent))

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
