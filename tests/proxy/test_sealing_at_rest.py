"""Encryption at rest against a real valkey-server writing an AOF and RDB snapshots, behind the real proxy:
what a user said is never on disk in plain text, every operation still answers it, and once the user's
memory is erased nothing that remains (every data key left, under every KEK of the keyring) opens it."""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sessionmem_core import api, env
from sessionmem_core.capability import Keyring as CapabilityKeyring
from sessionmem_core.capability import mint_capability, new_key, user_bucket
from sessionmem_core.devauth import dev_token
from sessionmem_core.env import ProxySettings
from sessionmem_core.keys import Owner, per_user_key, session_key
from sessionmem_proxy.app import create_app
from sessionmem_proxy.datakeys import Keyring, new_kek
from tests.support.serving import served_client
from tests.support.store_variants import UNTHROTTLED
from tests.support.valkey import ValkeyProcess

OWNER = Owner(namespace="team-a", agent="support-agent")
AUTH = {"Authorization": f"Bearer {dev_token(OWNER.namespace, OWNER.agent)}"}
ADMIN = {"Authorization": "Bearer dev-admin:dpo"}
USER = "end-user-7"
# What the end user says, and what the agent keeps in its own (not per-user) memory.
SENTENCE = "My passport number is QX7741903 and I live at 12 Lindenweg"
AGENT_NOTE = "Warehouse restock is due on Thursday for aisle nine"
# Where a sealed part starts: in raw bytes (its format byte 0x02), or in base64 (as entries were sealed before).
_SEALED_PART = re.compile(rb',"sealed":(?:\x02|"([A-Za-z0-9+/=]+)")')
# A raw sealed part's end is not marked in the files: this many bytes after its nonce are read (more than
# any entry here holds; what follows it decrypts to noise).
_LONGEST_CIPHERTEXT = 4096


@dataclass
class World:
    valkey: ValkeyProcess
    client: httpx.AsyncClient
    keyring_dir: Path
    key_dir: Path
    user_headers: dict[str, str]
    user_key: str


def _files(valkey: ValkeyProcess) -> dict[str, bytes]:
    """Every file valkey-server wrote: the AOF (base and increments) and the RDB snapshot."""
    return {str(p.relative_to(valkey.dir)): p.read_bytes() for p in valkey.dir.rglob("*") if p.is_file()}


def _persist(valkey: ValkeyProcess) -> dict[str, bytes]:
    """Snapshot to the RDB (uncompressed: a compressed string would hide plain text from the grep) and
    fsync the AOF, then answer the files."""
    sync: Any = valkey.client()
    sync.save()
    return _files(valkey)


def _remaining_keys(world: World) -> list[bytes]:
    """Every data key an attacker with the keyring and the key store could unwrap now."""
    keyring = Keyring.load(world.keyring_dir)
    deks: list[bytes] = []
    for path in world.key_dir.rglob("*.json"):
        record = orjson.loads(path.read_bytes())
        wrapped = base64.b64decode(record["wrapped"])
        for kek in keyring.keys.values():
            with contextlib.suppress(InvalidTag):
                context = b"sessionmem-dek\0" + "\0".join((record["unit"], record["dekId"], record["kid"])).encode()
                deks.append(AESGCM(kek).decrypt(wrapped[:12], wrapped[12:], context))
    return deks


def _sealed_parts(files: dict[str, bytes]) -> list[bytes]:
    """Every sealed part of an entry in the files, from its DEK id on."""
    everything = b"".join(files.values())
    parts: list[bytes] = []
    for match in _SEALED_PART.finditer(everything):
        if match.group(1):
            parts.append(base64.b64decode(match.group(1))[1:])
        else:
            parts.append(everything[match.end() : match.end() + 8 + 12 + _LONGEST_CIPHERTEXT])
    return parts


def _recoverable(files: dict[str, bytes], deks: list[bytes]) -> list[bytes]:
    """Every sealed part in the files decrypted with every data key, its tag not checked (AES-GCM's counter
    mode alone): what an attacker holding the key reads, without knowing where the part ends, nor the
    conversation and the id it is bound to."""
    opened: list[bytes] = []
    for part in _sealed_parts(files):
        nonce, body = part[8:20], part[20:]
        for dek in deks:
            decryptor = Cipher(algorithms.AES(dek), modes.CTR(nonce + b"\0\0\0\x02")).decryptor()
            opened.append(decryptor.update(body) + decryptor.finalize())
    return opened


@pytest.fixture
def aof_valkey() -> Iterator[ValkeyProcess]:
    server = ValkeyProcess(extra_args=("--appendonly", "yes", "--appendfsync", "always", "--rdbcompression", "no"))
    server.start()
    yield server
    server.close()


@contextlib.asynccontextmanager
async def _world(valkey: ValkeyProcess, tmp_path: Path, sealing: bool) -> AsyncIterator[World]:
    keyring_dir, key_dir = tmp_path / "kek", tmp_path / "deks"
    keyring_dir.mkdir()
    (keyring_dir / "2026-12").write_bytes(new_kek())
    capability_key = new_key()
    (tmp_path / "capability").write_bytes(capability_key)
    values = {
        env.VALKEY_URL: valkey.url,
        env.AUTH_MODE: "dev",
        env.CAPABILITY_KEY_FILE: str(tmp_path / "capability"),
        **UNTHROTTLED,
    }
    if sealing:
        values |= {
            env.SEALING_KEYRING: str(keyring_dir),
            env.SEALING_KEY_STORE: "directory",
            env.SEALING_KEY_DIR: str(key_dir),
        }
    app = create_app(ProxySettings.from_env(values))
    capability = mint_capability(capability_key, USER, OWNER, 600)
    bucket = user_bucket(CapabilityKeyring.single(capability_key), OWNER, USER)
    async with served_client(app) as client:
        client.headers.update(AUTH)
        yield World(
            valkey,
            client,
            keyring_dir,
            key_dir,
            {api.USER_CAPABILITY_HEADER: capability},
            per_user_key(OWNER, bucket, "trip"),
        )
        await app.aclose()


async def _say(world: World, conversation: str, content: str, headers: dict[str, str] | None = None) -> None:
    body = {"entries": [{"role": "user", "content": content, "item": {"type": "message", "text": content}}]}
    response = await world.client.post(api.entries_path(conversation), json=body, headers=headers)
    assert response.status_code == 200, response.text


async def test_without_sealing_the_files_hold_the_sentence(aof_valkey: ValkeyProcess, tmp_path: Path) -> None:
    """The control: the grep below finds plain text when there is some, in the AOF and in the snapshot."""
    async with _world(aof_valkey, tmp_path, sealing=False) as world:
        await _say(world, "trip", SENTENCE, world.user_headers)
        files = _persist(aof_valkey)
    holding = sorted(name for name, data in files.items() if SENTENCE.encode() in data)
    assert any(name.endswith(".rdb") for name in holding), holding
    assert any("aof" in name for name in holding), holding


async def test_sealed_memory_never_reaches_the_disk_and_is_gone_with_its_key(
    aof_valkey: ValkeyProcess, tmp_path: Path
) -> None:
    async with _world(aof_valkey, tmp_path, sealing=True) as world:
        await _say(world, "trip", SENTENCE, world.user_headers)
        await _say(world, "trip", "and my card ends in 4421", world.user_headers)
        await _say(world, "stock", AGENT_NOTE)
        # Everything a caller sees is the plain entry: reads, search, the item.
        read = (await world.client.get(api.entries_path("trip"), headers=world.user_headers)).json()
        assert [e["content"] for e in read["entries"]] == [SENTENCE, "and my card ends in 4421"]
        assert read["entries"][0]["item"] == {"type": "message", "text": SENTENCE}
        # (It was the newest entry of its write: the conversation's life id, in clear like the version.)
        assert list(read["entries"][0]) == ["id", "v", "life", "role", "content", "author", "ts", "item"]
        found = (await world.client.get(api.search_path("trip") + "?q=passport", headers=world.user_headers)).json()
        assert [e["content"] for e in found["matches"]] == [SENTENCE]
        summary = {"role": "system", "content": "The user gave their passport number", "id": "sum-1"}
        compacted = await world.client.post(
            "/v1/conversations/trip/compact",
            json={"summary": summary, "throughVersion": 1},
            headers=world.user_headers,
        )
        assert compacted.status_code == 200, compacted.text
        summarised = await world.client.get(api.entries_path("trip") + "?summary=true", headers=world.user_headers)
        assert summarised.json()["summary"]["content"] == summary["content"]
        titled = await world.client.patch(
            "/v1/conversations/trip/metadata",
            json={"title": "Passport renewal trip", "labels": {"topic": "passport-renewal"}},
            headers=world.user_headers,
        )
        assert titled.json()["title"] == "Passport renewal trip", titled.text
        listed = (await world.client.get("/v1/conversations", headers=world.user_headers)).json()
        assert [(c["title"], c["labels"]) for c in listed["conversations"]] == [
            ("Passport renewal trip", {"topic": "passport-renewal"})
        ]
        files = _persist(aof_valkey)
        for name, data in files.items():
            for secret in (SENTENCE, AGENT_NOTE, "passport", "Passport", "4421"):
                assert secret.encode() not in data, (name, secret)
        # The stored entry keeps its id, version and (it was the newest of its write) the conversation's
        # random life id in clear, and nothing else.
        stored = aof_valkey.client().lrange(world.user_key, 0, 0)[0]
        clear_head = rb'\{"id":"[^"]+","v":1,"life":"[A-Za-z0-9_-]+",'
        # The rest is sealed, in raw bytes: the format byte, the DEK id, the nonce, the ciphertext and its tag.
        assert re.fullmatch(clear_head + rb'"sealed":\x02.{36,}', stored, re.S), stored
        # Before the erasure, what the keys open is the conversation (the method below can find it).
        before = _recoverable(files, _remaining_keys(world))
        assert any(SENTENCE.encode() in text for text in before)

        erased = await world.client.delete(
            api.ADMIN_USER_MEMORY_PATH.format(namespace=OWNER.namespace, agent=OWNER.agent, user=USER), headers=ADMIN
        )
        assert erased.status_code == 200, erased.text
        receipt = erased.json()
        assert receipt["dataKeysDestroyed"] == [world.user_key.removeprefix("mem:").rsplit(":", 1)[0]]
        assert receipt["keys"] == [world.user_key]

        files = _persist(aof_valkey)
        # The AOF still holds the erased entries' bytes (an erasure is a DEL appended to it) ...
        assert len(_sealed_parts(files)) >= 3
        after = _recoverable(files, _remaining_keys(world))
        # ... and nothing left opens them, while the agent's own memory (not erased) still opens.
        assert not any(b"passport" in text or b"4421" in text for text in after)
        assert any(AGENT_NOTE.encode() in text for text in after)
        own = (await world.client.get(api.entries_path("stock"))).json()
        assert [e["content"] for e in own["entries"]] == [AGENT_NOTE]

        # The user comes back: a new data key, and the old entries stay unreadable with it.
        await _say(world, "trip", "starting over", world.user_headers)
        again = (await world.client.get(api.entries_path("trip"), headers=world.user_headers)).json()
        assert [e["content"] for e in again["entries"]] == ["starting over"]

        # Erasing the agent destroys its own key and its users' buckets' keys.
        agent_erased = await world.client.delete(
            api.ADMIN_AGENT_MEMORY_PATH.format(namespace=OWNER.namespace, agent=OWNER.agent), headers=ADMIN
        )
        assert agent_erased.json()["dataKeysDestroyed"] == [OWNER.author, receipt["dataKeysDestroyed"][0]]
        left = _recoverable(_persist(aof_valkey), _remaining_keys(world))
        assert not any(AGENT_NOTE.encode() in text for text in left)


async def test_operations_work_on_sealed_entries(aof_valkey: ValkeyProcess, tmp_path: Path) -> None:
    """pop, fork (whose copies are sealed anew for their conversation), rewind, summaries, export and an
    administrator's transcript answer the plain entries."""
    async with _world(aof_valkey, tmp_path, sealing=True) as world:
        client = world.client
        for text in ("one", "two", "three"):
            await _say(world, "src", text)
        popped = (await client.post("/v1/conversations/src/pop")).json()
        assert popped["entry"]["content"] == "three"
        forked = await client.post("/v1/conversations/src/fork", json={"conversationId": "branch"})
        assert forked.status_code == 200, forked.text
        branch = (await client.get(api.entries_path("branch"))).json()
        assert [e["content"] for e in branch["entries"]] == ["one", "two"]
        stored = aof_valkey.client().lrange(session_key(OWNER, "branch"), 0, -1)
        assert all(b',"sealed":\x02' in raw and b"one" not in raw for raw in stored)
        rewound = await client.post("/v1/conversations/src/rewind", json={"toVersion": 1})
        assert rewound.status_code == 200, rewound.text
        assert [e["content"] for e in (await client.get(api.entries_path("src"))).json()["entries"]] == ["one"]
        exported = [orjson.loads(line) for line in (await client.get(api.export_path("branch"))).content.splitlines()]
        assert "two" in str(exported)
        show = await client.get(
            api.ADMIN_CONVERSATION_PATH.format(namespace=OWNER.namespace, agent=OWNER.agent, conversationId="branch"),
            headers=ADMIN,
        )
        assert [e["content"] for e in show.json()["entries"]] == ["one", "two"]


async def test_a_moved_or_altered_entry_is_refused(aof_valkey: ValkeyProcess, tmp_path: Path) -> None:
    async with _world(aof_valkey, tmp_path, sealing=True) as world:
        await _say(world, "a", "mine")
        await _say(world, "b", "theirs")
        sync: Any = aof_valkey.client()
        moved = sync.lrange(session_key(OWNER, "a"), 0, 0)[0]
        sync.rpush(session_key(OWNER, "b"), moved.replace(b'"v":1', b'"v":2'))
        refused = await world.client.get(api.entries_path("b"))
        assert refused.status_code == 500
        assert refused.json()["error"]["type"] == "sealed_entry_invalid"
        flipped = bytearray(moved)
        flipped[-1] ^= 0x01  # the tag
        sync.lset(session_key(OWNER, "a"), 0, bytes(flipped))
        altered = await world.client.get(api.entries_path("a"))
        assert altered.json()["error"]["type"] == "sealed_entry_invalid"


async def test_a_key_store_that_cannot_be_written_fails_closed(aof_valkey: ValkeyProcess, tmp_path: Path) -> None:
    async with _world(aof_valkey, tmp_path, sealing=True) as world:
        world.key_dir.write_text("not a folder")  # the store cannot keep a key there
        response = await world.client.post(api.entries_path("c"), json={"entries": [{"role": "user", "content": "x"}]})
        assert response.status_code == 503, response.text
        assert response.json()["error"]["type"] == "data_key_unavailable"
        assert aof_valkey.client().exists(session_key(OWNER, "c")) == 0


async def test_an_erasure_whose_key_cannot_be_destroyed_erases_nothing(
    aof_valkey: ValkeyProcess, tmp_path: Path
) -> None:
    async with _world(aof_valkey, tmp_path, sealing=True) as world:
        await _say(world, "trip", SENTENCE, world.user_headers)
        (key_file,) = world.key_dir.glob("*/*.json")
        key_file.unlink()
        key_file.mkdir()  # where the key was, something the store cannot remove as a key
        erased = await world.client.delete(
            api.ADMIN_USER_MEMORY_PATH.format(namespace=OWNER.namespace, agent=OWNER.agent, user=USER), headers=ADMIN
        )
        assert erased.status_code == 503, erased.text
        assert erased.json()["error"]["type"] == "data_key_unavailable"
        assert aof_valkey.client().exists(world.user_key) == 1  # nothing is reported erased while its key lives
