"""Google ADK adapter: a ``BaseSessionService`` (``google.adk.sessions``) kept in sessionmem.

    from google.adk.runners import Runner
    from sessionmem_client import AsyncMemoryClient
    from sessionmem_client.google_adk import SessionmemSessionService

    runner = Runner(agent=agent, app_name="support", session_service=SessionmemSessionService(AsyncMemoryClient()))

Where things live, all of them conversations of the agent's own memory (and, for an agent with
``perUser: true``, of the end user whose turn the client's handle is):

- an ADK session is one conversation (``adk-s-<hash of app, user, session id>``). Its first entry records
  the session (app, user, id, initial state); each event is one more entry, the event as ADK gave it
  (``item``, returned unchanged: content parts, bytes, function calls and responses, actions, metadata).
  Every entry also carries the session's own state as it stands after it, so the newest entry alone
  answers the state and ``last_update_time`` and the stored cap may drop old events without losing state;
- ``user:`` state is one conversation per (app, user id) (``adk-u-...``) and ``app:`` state one per app
  (``adk-a-...``), each holding a single entry with the whole mapping, rewritten by a conditional replace
  (``If-Match``) that is retried when another writer got there first, so concurrent deltas merge;
- ``list_sessions`` reads the catalogue (newest write first, with a cursor): each session's conversation
  is labelled with hashes of its app and user id. ``temp:`` state is never stored (ADK's rule).

ADK's ``user_id`` is a label inside the agent's memory, never an identity: which end user's bucket a call
reaches comes only from the client's turn handle, which the launcher issued for the request in flight.
An agent naming another ``user_id`` while serving Alice's turn writes and reads in Alice's bucket, under
that name; it cannot reach a bucket it holds no turn for. So, on a ``perUser`` agent, make the service
per request (``SessionmemSessionService(client.with_turn(handle))``), and note that ``app:`` state is then
kept per end user too: a per-user agent has no memory shared by its users, by design.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from sessionmem_client._requests import EntryFields
from sessionmem_client.client import AsyncMemoryClient
from sessionmem_core import env
from sessionmem_core.errors import VersionConflict

try:
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig, ListSessionsResponse
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
except ImportError as exc:  # pragma: no cover - exercised only without google-adk
    raise ImportError("sessionmem_client.google_adk needs Google ADK: pip install google-adk") from exc

__all__ = ["SessionmemSessionService"]

ROLE_SESSION = "adk.session"  # a session's first entry
ROLE_EVENT = "adk.event"
ROLE_STATE = "adk.state"  # the one entry of a user: or app: state conversation
LABEL_KIND = "adk-kind"
LABEL_APP = "adk-app"
LABEL_USER = "adk-user"
_KIND_SESSION = "session"
# Conditional rewrites of a user: or app: state conversation lost to another writer before giving up.
_MERGE_ATTEMPTS = 16
_PAGE = 100


def _digest(*parts: str) -> str:
    """A stable, id-safe name for any strings (ADK ids may hold what a conversation id may not)."""
    return hashlib.sha256(b"\x00".join(part.encode() for part in parts)).hexdigest()


def session_conversation(app_name: str, user_id: str, session_id: str) -> str:
    return f"adk-s-{_digest(app_name, user_id, session_id)}"


def user_state_conversation(app_name: str, user_id: str) -> str:
    return f"adk-u-{_digest(app_name, user_id)}"


def app_state_conversation(app_name: str) -> str:
    return f"adk-a-{_digest(app_name)}"


def _split(state: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(app, user, session) parts of a state mapping or delta, prefixes removed; ``temp:`` keys dropped."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    session: dict[str, Any] = {}
    for key, value in (state or {}).items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            session[key] = value
    return app, user, session


def _event_text(event: Event) -> str:
    """What search, token budgets and summaries see of an event: the text of its parts."""
    parts = event.content.parts if event.content and event.content.parts else []
    return "\n".join(part.text for part in parts if part.text)[: env.MAX_CONTENT_CHARS]


def _entry(role: str, record: Mapping[str, Any], content: str = "") -> EntryFields:
    return {"role": role, "content": content, "item": dict(record)}


def _newest(entries: list[dict[str, Any]], role: str | None = None) -> dict[str, Any] | None:
    """The item of the newest entry (of ``role``, or of a session: a record or an event)."""
    roles = (role,) if role else (ROLE_SESSION, ROLE_EVENT)
    for entry in reversed(entries):
        item = entry.get("item")
        if entry.get("role") in roles and isinstance(item, dict):
            return item
    return None


class SessionmemSessionService(BaseSessionService):
    """ADK sessions, their events and their session, ``user:`` and ``app:`` state, in sessionmem.

    ``client``: the memory endpoint's async client (for a ``perUser`` agent, one carrying the turn handle
    of the request being served: ``client.with_turn(handle)``). A session id is stripped of surrounding
    whitespace, as ADK's own services do.
    """

    def __init__(self, client: AsyncMemoryClient | None = None) -> None:
        self._owned: AsyncMemoryClient | None = None
        if client is None:
            client = self._owned = AsyncMemoryClient()
        self.client = client

    # --- sessions ---

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        session_id = (session_id or "").strip() or new_session_id()
        app_delta, user_delta, session_state = _split(state)
        now = _now()
        record = {
            "app_name": app_name,
            "user_id": user_id,
            "id": session_id,
            "state": session_state,
            "last_update_time": now,
        }
        conversation = session_conversation(app_name, user_id, session_id)
        try:  # created only where nothing is stored yet (If-Match: 0): one atomic step
            await self.client.replace(conversation, [_entry(ROLE_SESSION, record)], if_version=0)
        except VersionConflict as exc:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.") from exc
        await self.client.set_metadata(
            conversation,
            labels={LABEL_KIND: _KIND_SESSION, LABEL_APP: _digest(app_name), LABEL_USER: _digest(app_name, user_id)},
        )
        if app_delta:
            await self._merge(app_state_conversation(app_name), app_delta)
        if user_delta:
            await self._merge(user_state_conversation(app_name, user_id), user_delta)
        session = Session(app_name=app_name, user_id=user_id, id=session_id, state=session_state, last_update_time=now)
        return await self._with_scoped_state(session)

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        session_id = session_id.strip() if session_id else session_id
        recent = config.num_recent_events if config is not None and config.after_timestamp is None else None
        # The newest ``recent`` events and the entry before them suffice (it may be the session's record).
        window = recent + 1 if recent is not None and recent + 1 <= env.MAX_READ_LIMIT else None
        entries = await self.client._read_entries(session_conversation(app_name, user_id, session_id), window)
        newest = _newest(entries)
        if newest is None:
            return None
        events = [
            Event.model_validate(entry["item"]["event"])
            for entry in entries
            if entry.get("role") == ROLE_EVENT and isinstance(entry.get("item"), dict)
        ]
        if config is not None:
            if config.num_recent_events is not None:
                events = events[-config.num_recent_events :] if config.num_recent_events else []
            if config.after_timestamp is not None:
                events = [event for event in events if event.timestamp >= config.after_timestamp]
        session = Session(
            app_name=app_name,
            user_id=user_id,
            id=session_id,
            state=dict(newest["state"]),
            events=events,
            last_update_time=newest["last_update_time"],
        )
        return await self._with_scoped_state(session)

    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        """The app's sessions (of ``user_id``, or of every user id), without events, oldest update first,
        each with its state merged as ``get_session`` merges it."""
        wanted = {LABEL_KIND: _KIND_SESSION, LABEL_APP: _digest(app_name)}
        if user_id is not None:
            wanted[LABEL_USER] = _digest(app_name, user_id)
        sessions: list[Session] = []
        scoped: dict[str, dict[str, Any]] = {}  # one read of each app: and user: state per listing
        cursor: str | None = None
        while True:
            page = await self.client.list_conversations(_PAGE, cursor)
            for ref in page.conversations:
                if all(ref.labels.get(name) == value for name, value in wanted.items()):
                    newest = _newest(await self.client._read_entries(ref.conversation_id, 1))
                    if newest is not None and newest.get("app_name", app_name) == app_name:
                        sessions.append(await self._with_scoped_state(_listed(newest), scoped))
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        session_id = session_id.strip() if session_id else session_id
        await self.client.delete(session_conversation(app_name, user_id, session_id))

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return await self._state(user_state_conversation(app_name, user_id))

    # --- events ---

    async def append_event(self, session: Session, event: Event) -> Event:
        """Store ``event`` (not a partial one) as one entry carrying the session's state after it; its
        ``user:`` and ``app:`` deltas merge into their conversations. A session copy that is behind the
        stored one (another writer appended since it was read) still appends: its delta merges into the
        stored state, as ADK's in-memory service does. The stored state is read, merged and appended
        conditional on the version read (``If-Match``): when another writer appended in between, the
        read and the merge start over, so concurrent writers never drop each other's state."""
        if event.partial:
            return event
        conversation = session_conversation(session.app_name, session.user_id, session.id)
        stored, version = await self._newest_event(conversation)
        if stored is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        await super().append_event(session=session, event=event)  # temp: state applied, then trimmed
        session.last_update_time = event.timestamp
        app_delta, user_delta, session_delta = _split(event.actions.state_delta if event.actions else None)
        event_json = event.model_dump(mode="json", exclude_none=True)
        # The key is the event's content: a retried append of an equal event is stored once.
        key = "adk." + hashlib.sha256(orjson.dumps(event_json, option=orjson.OPT_SORT_KEYS)).hexdigest()
        for _ in range(_MERGE_ATTEMPTS):
            record = {
                "app_name": session.app_name,
                "user_id": session.user_id,
                "id": session.id,
                "state": {**stored["state"], **session_delta},
                "last_update_time": event.timestamp,
                "event": event_json,
            }
            entry = _entry(ROLE_EVENT, record, _event_text(event))
            try:
                await self.client._append_batch(conversation, [entry], key, if_version=version)
                break
            except VersionConflict:
                stored, version = await self._newest_event(conversation)
                if stored is None:
                    raise SessionNotFoundError(f"Session {session.id} not found.") from None
        else:
            raise VersionConflict(f"session {session.id} kept moving: {_MERGE_ATTEMPTS} attempts lost")
        if app_delta:
            await self._merge(app_state_conversation(session.app_name), app_delta)
        if user_delta:
            await self._merge(user_state_conversation(session.app_name, session.user_id), user_delta)
        return event

    async def _newest_event(self, conversation: str) -> tuple[dict[str, Any] | None, int]:
        """The newest record or event of a session conversation (None when it holds none), and the
        conversation's version, in one read."""
        history = await self.client.read(conversation, limit=1)
        return _newest([{"role": e.role, "item": e.item} for e in history.entries]), history.version

    # --- user: and app: state ---

    async def _state(self, conversation: str) -> dict[str, Any]:
        newest = _newest(await self.client._read_entries(conversation, 1), ROLE_STATE)
        return dict(newest["state"]) if newest is not None else {}

    async def _merge(self, conversation: str, delta: Mapping[str, Any]) -> None:
        """Merge ``delta`` into a state conversation: read, merge, replace if nothing moved in between."""
        for _ in range(_MERGE_ATTEMPTS):
            history = await self.client.read(conversation, limit=1)
            current = history.entries[-1].item if history.entries else None
            state = dict(current.get("state", {})) if isinstance(current, dict) else {}
            state.update(delta)
            try:
                await self.client.replace(
                    conversation, [_entry(ROLE_STATE, {"state": state})], if_version=history.version
                )
                return
            except VersionConflict:
                continue
        raise VersionConflict(f"state of {conversation} kept moving: {_MERGE_ATTEMPTS} attempts lost")

    async def _with_scoped_state(self, session: Session, read: dict[str, dict[str, Any]] | None = None) -> Session:
        """``session`` with its app's ``app:`` and its user's ``user:`` state merged in, prefixed (``read``:
        the states read already, by conversation)."""
        read = {} if read is None else read
        scopes = (
            (State.APP_PREFIX, app_state_conversation(session.app_name)),
            (State.USER_PREFIX, user_state_conversation(session.app_name, session.user_id)),
        )
        for prefix, conversation in scopes:
            if conversation not in read:
                read[conversation] = await self._state(conversation)
            for key, value in read[conversation].items():
                session.state[prefix + key] = value
        return session

    # --- lifetime ---

    async def aclose(self) -> None:
        """Close the client this service made itself (a client passed in is the caller's to close)."""
        if self._owned is not None:
            await self._owned.aclose()


def _listed(record: Mapping[str, Any]) -> Session:
    return Session(
        app_name=record["app_name"],
        user_id=record["user_id"],
        id=record["id"],
        state=dict(record["state"]),
        last_update_time=record["last_update_time"],
    )


def new_session_id() -> str:
    """A fresh session id, as ADK makes them (a UUID4)."""
    return str(uuid.uuid4())


def _now() -> float:
    return time.time()
