"""The proxy's store against a real valkey-server, as the proxy runs it on a standalone server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sessionmem_proxy.store import ConversationStore, UsageLedger
from sessionmem_proxy.valkey_client import connect
from tests.support.valkey import ValkeyProcess


@pytest.fixture
async def store(valkey_server: ValkeyProcess) -> AsyncIterator[ConversationStore]:
    """Its pipelining client and the accounting: every write counted, its sizes and retry index kept."""
    client = connect(valkey_server.url, 5.0)
    yield ConversationStore(client, UsageLedger(client))
    await client.aclose()
