"""Encryption at rest across proxy replicas: two proxies, each with its own cache of data keys, share one
real valkey-server and one data key store. After an erasure through one, the other still caches the
destroyed key; every write it acknowledges afterwards must be readable (sealed with the unit's new key),
never a 200 whose entry no key opens. Run with the accounting in the write's own script (standalone
Valkey) and in separate calls (as on a Valkey Cluster)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from sessionmem_core import api, env
from sessionmem_core.capability import mint_capability, new_key
from sessionmem_core.devauth import dev_token
from sessionmem_core.env import ProxySettings
from sessionmem_core.keys import Owner, session_key
from sessionmem_proxy.admission import QuotaLimits
from sessionmem_proxy.app import create_app
from sessionmem_proxy.datakeys import DirectoryDataKeyStore, Keyring, WrappedDataKey, new_kek
from sessionmem_proxy.sealing import Sealer
from sessionmem_proxy.store import ConversationStore, NewEntry, UsageLedger
from sessionmem_proxy.valkey_client import connect
from tests.support.serving import served_client
from tests.support.store_variants import UNTHROTTLED
from tests.support.valkey import ValkeyProcess

OWNER = Owner(namespace="team-a", agent="support-agent")
AUTH = {"Authorization": f"Bearer {dev_token(OWNER.namespace, OWNER.agent)}"}
ADMIN = {"Authorization": "Bearer dev-admin:dpo"}
USER = "end-user-7"
AGENT_ERASE = api.ADMIN_AGENT_MEMORY_PATH.format(namespace=OWNER.namespace, agent=OWNER.agent)
USER_ERASE = api.ADMIN_USER_MEMORY_PATH.format(namespace=OWNER.namespace, agent=OWNER.agent, user=USER)
VARIANTS = ("one-script", "cluster-style")


@dataclass
class Replicas:
    first: httpx.AsyncClient
    second: httpx.AsyncClient
    user: dict[str, str]  # the end user's capability, for a perUser bucket


@contextlib.asynccontextmanager
async def _replicas(valkey: ValkeyProcess, tmp_path: Path, variant: str) -> AsyncIterator[Replicas]:
    """Two proxies (each its own app, Valkey client and data key cache: 30 s, the default) on one
    valkey-server, one keyring and one data key store."""
    (tmp_path / "kek").write_bytes(new_kek())
    capability_key = new_key()
    (tmp_path / "capability").write_bytes(capability_key)
    settings = ProxySettings.from_env(
        {
            env.VALKEY_URL: valkey.url,
            env.AUTH_MODE: "dev",
            env.CAPABILITY_KEY_FILE: str(tmp_path / "capability"),
            **UNTHROTTLED,
        }
    )
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for _ in range(2):
            client = connect(valkey.url, 2.0)
            stack.push_async_callback(client.aclose)
            ledger = UsageLedger(client)
            ledger.atomic = variant == "one-script"
            sealer = Sealer(Keyring.load(tmp_path / "kek"), DirectoryDataKeyStore(tmp_path / "deks"))
            app = create_app(settings, store=ConversationStore(client, ledger, sealer))
            stack.push_async_callback(app.aclose)
            served = await stack.enter_async_context(served_client(app))
            served.headers.update(AUTH)
            clients.append(served)
        capability = mint_capability(capability_key, USER, OWNER, 600)
        yield Replicas(clients[0], clients[1], {api.USER_CAPABILITY_HEADER: capability})


async def _ok(response: Awaitable[httpx.Response]) -> Any:
    answered = await response
    assert answered.status_code == 200, answered.text
    return answered.json()


async def _say(client: httpx.AsyncClient, conversation: str, content: str, headers: dict[str, str]) -> Any:
    body = {"entries": [{"role": "user", "content": content}]}
    return await _ok(client.post(api.entries_path(conversation), json=body, headers=headers))


async def _contents(client: httpx.AsyncClient, conversation: str, headers: dict[str, str]) -> list[str]:
    read = await _ok(client.get(api.entries_path(conversation), headers=headers))
    return [entry["content"] for entry in read["entries"]]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("erased", ["agent", "user"])
async def test_an_append_through_a_replica_caching_an_erased_key_stays_readable(
    valkey_server: ValkeyProcess, tmp_path: Path, variant: str, erased: str
) -> None:
    async with _replicas(valkey_server, tmp_path, variant) as replicas:
        headers = replicas.user if erased == "user" else {}
        await _say(replicas.second, "trip", "before the erasure", headers)  # the second caches the key
        receipt = await _ok(replicas.first.delete(AGENT_ERASE if erased == "agent" else USER_ERASE, headers=ADMIN))
        assert receipt["dataKeysDestroyed"], receipt
        # Well within the second's cache time: it still holds the destroyed key.
        after = await _say(replicas.second, "trip", "after the erasure", headers)
        assert after["version"] == 1
        for client in (replicas.first, replicas.second):
            assert await _contents(client, "trip", headers) == ["after the erasure"]
        await _say(replicas.second, "trip", "and more", headers)
        assert await _contents(replicas.first, "trip", headers) == ["after the erasure", "and more"]


async def _compact(client: httpx.AsyncClient) -> None:
    summary = {"role": "system", "content": "a summary written after the erasure", "id": "sum-1"}
    await _ok(client.post("/v1/conversations/c/compact", json={"summary": summary, "throughVersion": 1}))


async def _summary(client: httpx.AsyncClient) -> str | None:
    read = await _ok(client.get(api.entries_path("c") + "?summary=true"))
    return read["summary"]["content"] if read.get("summary") else None


async def _title(client: httpx.AsyncClient) -> None:
    await _ok(client.patch("/v1/conversations/c/metadata", json={"title": "titled after the erasure"}))


async def _titles(client: httpx.AsyncClient) -> str | None:
    listed = await _ok(client.get(api.CONVERSATIONS_PATH))
    return str([c["title"] for c in listed["conversations"] if c["conversationId"] == "c"])


async def _fork(client: httpx.AsyncClient) -> None:
    await _ok(client.post("/v1/conversations/c/fork", json={"conversationId": "branch"}))


async def _branch(client: httpx.AsyncClient) -> str:
    return str(await _contents(client, "branch", {}))


async def _replace(client: httpx.AsyncClient) -> None:
    body = {"entries": [{"role": "user", "content": "replaced after the erasure"}]}
    await _ok(client.put(api.conversation_path("c"), json=body))


async def _replaced(client: httpx.AsyncClient) -> str:
    return str(await _contents(client, "c", {}))


WRITES: dict[str, tuple[Callable[[httpx.AsyncClient], Awaitable[None]], Callable[[httpx.AsyncClient], Awaitable[Any]]]]
WRITES = {
    "compact": (_compact, _summary),
    "metadata": (_title, _titles),
    "fork": (_fork, _branch),
    "replace": (_replace, _replaced),
}
EXPECTED = {
    "compact": "a summary written after the erasure",
    "metadata": "['titled after the erasure']",
    "fork": "['written after the erasure']",
    "replace": "['replaced after the erasure']",
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("write", sorted(WRITES))
async def test_every_write_that_seals_refuses_an_erased_key(
    valkey_server: ValkeyProcess, tmp_path: Path, variant: str, write: str
) -> None:
    """Summaries, titles, a fork's copies and a replace seal too: sealed through the replica that still
    caches the erased key, they are readable through both."""
    async with _replicas(valkey_server, tmp_path, variant) as replicas:
        await _say(replicas.second, "c", "before the erasure", {})  # the second caches the key
        await _ok(replicas.first.delete(AGENT_ERASE, headers=ADMIN))
        # The first writes with the unit's new key, so there is a conversation to summarise, title or fork.
        await _say(replicas.first, "c", "written after the erasure", {})
        act, observe = WRITES[write]
        await act(replicas.second)
        for client in (replicas.first, replicas.second):
            assert await observe(client) == EXPECTED[write]


class _ErasedOnCreate(DirectoryDataKeyStore):
    """The data key store, where an erasure runs (once) right after a key is made: the interleaving of an
    erasure between a writer's asking for the unit's new key and its marking that key current."""

    erase: Callable[[], Awaitable[object]] | None = None

    async def create(self, record: WrappedDataKey) -> WrappedDataKey:
        stored = await super().create(record)
        erase, self.erase = self.erase, None
        if erase is not None:
            await erase()
        return stored


@pytest.mark.parametrize("variant", VARIANTS)
async def test_a_key_erased_before_it_is_marked_current_is_never_written_with(
    valkey_server: ValkeyProcess, tmp_path: Path, variant: str
) -> None:
    (tmp_path / "kek").write_bytes(new_kek())
    keyring = Keyring.load(tmp_path / "kek")
    quota = QuotaLimits.defaults(ProxySettings.from_env({}))
    key, unit = session_key(OWNER, "race"), OWNER.author
    client = connect(valkey_server.url, 2.0)
    try:
        ledger = UsageLedger(client)
        ledger.atomic = variant == "one-script"
        racing = _ErasedOnCreate(tmp_path / "deks")
        writer = ConversationStore(client, ledger, Sealer(keyring, racing))
        eraser = ConversationStore(client, ledger, Sealer(keyring, DirectoryDataKeyStore(tmp_path / "deks")))
        await writer.append(key, [NewEntry("user", "before")], OWNER.author, 10, 60, quota)  # cached by the writer
        assert await eraser.erase_data_keys(unit) == [unit]
        racing.erase = functools.partial(eraser.erase_data_keys, unit)
        # Refused (its cached key is erased), the writer makes the unit's new key, which is erased at once;
        # marking it current then fails, and the writer takes the key made after that.
        await writer.append(key, [NewEntry("user", "after")], OWNER.author, 10, 60, quota)
        assert racing.erase is None  # the second erasure ran
        for store in (writer, eraser):
            opened = (await store.read(key, 10)).raw_entries
            assert [orjson.loads(raw)["content"] for raw in opened] == ["after"]
    finally:
        await client.aclose()
