"""The Google ADK session service against the real stack (in-process launcher, real proxy process, real
valkey-server): on a perUser agent, ADK's ``user_id`` is a label inside the bucket of the turn the client
holds, never a way into another end user's bucket; past the stored cap, a session keeps its state.
(ADK's own contract tests run in tests/client/frameworks.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from opentelemetry.sdk.trace import TracerProvider

from sessionmem_client import AsyncMemoryClient, TurnNotLive, UserCapabilityRequired
from sessionmem_client._requests import EntryFields
from sessionmem_client.google_adk import SessionmemSessionService
from sessionmem_core import env
from sessionmem_core.capability import mint_capability
from sessionmem_core.keys import bucket_of
from sessionmem_launcher.server import Launcher
from tests.client.test_docs import EXAMPLES, NOT_RUN
from tests.client.test_lifecycle import (  # noqa: F401 - fixtures
    OWNER,
    agent_keys,
    capability_key,
    memory_url,
    per_user_launcher,
    per_user_proxy,
)
from tests.conftest import launcher_settings
from tests.support.processes import ServiceProcess
from tests.support.serving import serve_in_background
from tests.support.valkey import ValkeyProcess


def by_bucket(valkey: ValkeyProcess) -> dict[str | None, list[str]]:
    found: dict[str | None, list[str]] = {}
    for key in agent_keys(valkey):
        found.setdefault(bucket_of(key), []).append(key)
    return found


def docs_service_factory(monkeypatch: pytest.MonkeyPatch, port: int) -> Callable[[Mapping[str, str]], Any]:
    """``session_service_for`` of docs/client.md's per-user ADK example, its client on ``port``."""
    (code,) = [code for section, code in EXAMPLES if section == "Google ADK" and code.startswith(NOT_RUN)]
    monkeypatch.setenv(env.LAUNCHER_PORT, str(port))  # the client's default URL, as in a pod
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(code, "docs/client.md", "exec"), namespace)  # noqa: S102 - our own documentation
    factory: Callable[[Mapping[str, str]], Any] = namespace["session_service_for"]
    return factory


def state_event(delta: dict[str, object]) -> Event:
    return Event(invocation_id="inv", author="user", actions=EventActions(state_delta=delta))


async def test_naming_another_user_id_reaches_only_the_turns_own_bucket(
    per_user_launcher: Launcher,  # noqa: F811 - the fixture
    valkey_server: ValkeyProcess,
    capability_key: bytes,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session_service_for = docs_service_factory(monkeypatch, per_user_launcher.memory_port)
    turns = per_user_launcher.turns
    alice_cap = mint_capability(capability_key, "alice", OWNER, 600)
    bob_cap = mint_capability(capability_key, "bob", OWNER, 600)
    with turns.bound(alice_cap) as alice_turn, turns.bound(bob_cap) as bob_turn:
        async with AsyncMemoryClient(memory_url(per_user_launcher), turn=bob_turn) as bob_client:
            bob = SessionmemSessionService(bob_client)
            serving_alice = session_service_for({"x-sessionmem-turn": alice_turn})

            mine = await bob.create_session(app_name="shop", user_id="bob", session_id="s", state={"user:plan": "gold"})
            await bob.append_event(mine, state_event({"app:banner": "sale", "cart": 3}))
            (bob_bucket,) = by_bucket(valkey_server)
            bobs_keys = by_bucket(valkey_server)[bob_bucket]

            # Serving Alice, the agent names Bob: none of Bob's sessions or state is there to read...
            assert await serving_alice.get_session(app_name="shop", user_id="bob", session_id="s") is None
            assert await serving_alice.get_user_state(app_name="shop", user_id="bob") == {}
            assert (await serving_alice.list_sessions(app_name="shop")).sessions == []
            # ...and what it writes under his name lands in Alice's bucket, labelled "bob".
            forged = await serving_alice.create_session(
                app_name="shop", user_id="bob", session_id="s", state={"user:plan": "free"}
            )
            assert forged.state == {"user:plan": "free"}, "Bob's app: state is not Alice's either"
            await serving_alice.append_event(forged, state_event({"user:plan": "none", "app:banner": "forged"}))

            buckets = by_bucket(valkey_server)
            assert set(buckets) == {bob_bucket, next(b for b in buckets if b != bob_bucket)}
            assert buckets[bob_bucket] == bobs_keys, "nothing written in Bob's bucket while serving Alice"
            again = await bob.get_session(app_name="shop", user_id="bob", session_id="s")
            assert again is not None
            assert again.state == {"user:plan": "gold", "app:banner": "sale", "cart": 3}
            assert [e.actions.state_delta for e in again.events] == [{"app:banner": "sale", "cart": 3}]
            assert [s.id for s in (await serving_alice.list_sessions(app_name="shop", user_id="bob")).sessions] == ["s"]

    with pytest.raises(TurnNotLive):  # the turns are over: their handles reach nothing any more
        await serving_alice.get_session(app_name="shop", user_id="bob", session_id="s")
    async with AsyncMemoryClient(memory_url(per_user_launcher)) as no_turn:
        with pytest.raises(UserCapabilityRequired):  # and without a turn there is no bucket at all
            await SessionmemSessionService(no_turn).list_sessions(app_name="shop")


async def test_past_the_stored_cap_a_session_keeps_its_state_and_newest_events(
    proxy_process: ServiceProcess, dev_token_file: Path
) -> None:
    settings = launcher_settings(proxy_process.base_url, dev_token_file, **{env.CAP: "4"})
    launcher = Launcher(settings, tracer_provider=TracerProvider(), serve_host="127.0.0.1", serve=serve_in_background)
    await launcher.start()
    try:
        async with AsyncMemoryClient(memory_url(launcher)) as memory:
            service = SessionmemSessionService(memory)
            session = await service.create_session(app_name="shop", user_id="ada", state={"first": 0})
            for n in range(1, 10):  # the record and 9 events: the oldest 6 entries are trimmed away
                await service.append_event(session, state_event({f"k{n}": n, "last": n}))
            stored = await service.get_session(app_name="shop", user_id="ada", session_id=session.id)
            listed = (await service.list_sessions(app_name="shop", user_id="ada")).sessions
    finally:
        await launcher.stop()
    assert stored is not None
    assert [e.actions.state_delta["last"] for e in stored.events] == [6, 7, 8, 9]
    assert stored.state == {"first": 0, "last": 9, **{f"k{n}": n for n in range(1, 10)}} == session.state
    assert stored.last_update_time == session.last_update_time
    assert [(s.id, s.state) for s in listed] == [(session.id, stored.state)]


async def test_an_equal_event_appended_again_is_stored_once(launcher: Launcher) -> None:
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        service = SessionmemSessionService(memory)
        session = await service.create_session(app_name="shop", user_id="ada")
        event = state_event({"cart": 1})
        await service.append_event(session, event)
        await service.append_event(session, event.model_copy(deep=True))  # a re-delivery, e.g. after a timeout
        await service.append_event(session, state_event({"cart": 1}))  # a new event (its own id): kept
        stored = await service.get_session(app_name="shop", user_id="ada", session_id=session.id)
    assert stored is not None
    assert [e.id for e in stored.events] == [event.id, session.events[-1].id]


class AppendsAfter(AsyncMemoryClient):
    """A real client whose first append is sent only after ``before`` ran: another writer's whole
    ``append_event`` lands between this writer's read of the session and its write."""

    def __init__(self, base_url: str, before: Callable[[], Awaitable[object]]) -> None:
        super().__init__(base_url)
        self._before: Callable[[], Awaitable[object]] | None = before

    async def _append_batch(
        self,
        conversation_id: str,
        entries: list[EntryFields],
        idempotency_key: str | None = None,
        if_version: int | None = None,
    ) -> None:
        before, self._before = self._before, None
        if before is not None:
            await before()
        await super()._append_batch(conversation_id, entries, idempotency_key, if_version)


async def test_two_writers_of_one_session_keep_each_others_state(launcher: Launcher) -> None:
    """Each writer reads the stored state, merges its delta and appends conditional on what it read: the
    writer that lost the race reads again, so neither delta is dropped (each event's entry carries the
    whole session state, and the newest one answers it)."""
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        other = SessionmemSessionService(memory)
        mine = await other.create_session(app_name="shop", user_id="ada", session_id="s", state={"seen": 1})
        theirs = await other.get_session(app_name="shop", user_id="ada", session_id="s")
        assert theirs is not None

        async with AppendsAfter(
            memory_url(launcher), lambda: other.append_event(theirs, state_event({"cart": 3}))
        ) as racing:
            await SessionmemSessionService(racing).append_event(mine, state_event({"coupon": "SAVE"}))
        stored = await other.get_session(app_name="shop", user_id="ada", session_id="s")
    assert stored is not None
    assert stored.state == {"seen": 1, "cart": 3, "coupon": "SAVE"}
    assert [e.actions.state_delta for e in stored.events] == [{"cart": 3}, {"coupon": "SAVE"}]
