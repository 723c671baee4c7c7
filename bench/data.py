"""What the benchmark stores and reads: a chat exchange of realistic size, and the seeded conversations.

Seeding goes through the project's own store (``sessionmem_proxy.store.ConversationStore``) and key layout
(``sessionmem_core.keys``), so the entries the proxy reads back are exactly the ones it would have written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import orjson

from bench.procs import DEV_AGENT, DEV_NAMESPACE
from sessionmem_core import env
from sessionmem_core.keys import Owner, session_key
from sessionmem_proxy.datakeys import DirectoryDataKeyStore, Keyring, new_kek
from sessionmem_proxy.sealing import Sealer
from sessionmem_proxy.store import ConversationStore, NewEntry
from sessionmem_proxy.valkey_client import connect

# One exchange: a short question and a few sentences of answer (~90 and ~270 characters).
USER_TEXT = "Hi, I ordered the blue running shoes last week (order 4471). Can I still change the size to 43?"
ASSISTANT_TEXT = (
    "Yes. Order 4471 has not shipped yet, so I changed the size from 42 to 43 for you. The price is the same, "
    "and the new delivery estimate is Thursday. You will get an updated confirmation email in a few minutes. "
    "Anything else I can help with?"
)
CONVERSATIONS = 64  # distinct conversations each load spreads over (one per connection at 64 connections)
READ_LIMIT = env.DEFAULT_REPLAY_MESSAGES  # 40
CAP = env.DEFAULT_CAP  # 500
TTL_SECONDS = env.DEFAULT_TTL_SECONDS

OWNER = Owner(namespace=DEV_NAMESPACE, agent=DEV_AGENT)


def exchange_body() -> bytes:
    """The proxy/launcher append body: one {user, assistant} exchange (ids minted server-side)."""
    return orjson.dumps(
        {"entries": [{"role": "user", "content": USER_TEXT}, {"role": "assistant", "content": ASSISTANT_TEXT}]}
    )


def conversation_ids(prefix: str, count: int = CONVERSATIONS) -> list[str]:
    return [f"{prefix}-{i}" for i in range(count)]


def proxy_key(conversation_id: str, agent: str = DEV_AGENT) -> str:
    return session_key(Owner(namespace=DEV_NAMESPACE, agent=agent), conversation_id)


def ceiling_keys(kind: str, count: int = CONVERSATIONS) -> list[str]:
    # valkey-benchmark/redis-benchmark's __rand_int__ with -r N expands to a 12-digit zero-padded number.
    return [f"bench:ceiling:{kind}:{i:012d}" for i in range(count)]


def _exchange_entries(count: int) -> list[NewEntry]:
    return [
        NewEntry(role="user", content=USER_TEXT) if i % 2 == 0 else NewEntry(role="assistant", content=ASSISTANT_TEXT)
        for i in range(count)
    ]


async def _seed(valkey_url: str, keys: Sequence[str], entries: int, sealing: SealingKeys | None, author: str) -> None:
    client = connect(valkey_url, 5.0)
    sealer = None
    if sealing is not None:
        sealer = Sealer(Keyring.load(sealing.keyring), DirectoryDataKeyStore(sealing.key_dir))
    store = ConversationStore(client, sealer=sealer)
    try:

        async def one(key: str) -> None:
            await store.delete(key)
            remaining = entries
            while remaining > 0:
                batch = min(remaining, env.MAX_ENTRIES_PER_APPEND)
                await store.append(key, _exchange_entries(batch), author, CAP, TTL_SECONDS)
                remaining -= batch

        await asyncio.gather(*(one(k) for k in keys))
    finally:
        await client.aclose()


def seed(
    valkey_url: str, keys: Sequence[str], entries: int, sealing: SealingKeys | None = None, agent: str = DEV_AGENT
) -> None:
    """Make each key a conversation of ``entries`` entries (alternating user/assistant), written by
    ``agent``; with ``sealing``, sealed as a proxy with those keys stores them (encryption at rest)."""
    author = Owner(namespace=DEV_NAMESPACE, agent=agent).author
    asyncio.run(_seed(valkey_url, keys, entries, sealing, author))


@dataclass(frozen=True)
class SealingKeys:
    """Encryption at rest for the benchmark: a one-key KEK keyring and a directory of data keys."""

    keyring: Path
    key_dir: Path

    @classmethod
    def make(cls, root: Path) -> SealingKeys:
        (root / "keyring").mkdir(parents=True, exist_ok=True)
        (root / "keyring" / "bench").write_bytes(new_kek())
        return cls(root / "keyring", root / "data-keys")

    def proxy_env(self) -> dict[str, str]:
        return {
            env.SEALING_KEYRING: str(self.keyring),
            env.SEALING_KEY_STORE: "directory",
            env.SEALING_KEY_DIR: str(self.key_dir),
        }


def stored_entry_bytes(valkey_url: str, key: str) -> int:
    """Size of one stored entry as the proxy returns it (for the report)."""
    import valkey

    client = valkey.Valkey.from_url(valkey_url)
    raw = cast(list[bytes], client.lrange(key, -READ_LIMIT, -1))
    return sum(len(r) for r in raw) // max(1, len(raw))
