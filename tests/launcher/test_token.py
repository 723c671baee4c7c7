"""The pod token as the launcher sends it: read from real files laid out as the kubelet projects them, a
rotation picked up on the next call, and a token that cannot be read is a typed 503, never a stale copy."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner, session_key
from sessionmem_launcher.server import Launcher
from tests.conftest import launcher_settings
from tests.support.processes import ServiceProcess
from tests.support.serving import serve_in_background
from tests.support.valkey import ValkeyProcess

# Same length on purpose: a rotation must be seen even when the file's size does not change.
SUPPORT = Owner(namespace="team-a", agent="support-agent")
BILLING = Owner(namespace="team-a", agent="billing-agent")
ENTRY = {"entries": [{"role": "user", "content": "hi", "id": "t1-u"}]}


class ProjectedToken:
    """A projected-volume directory as the kubelet writes it: ``token -> ..data/token`` and
    ``..data -> ..<timestamp>``, rotated by writing a new timestamped directory and renaming a new
    ``..data`` symlink over the old one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / "token"
        self._generation = 0

    def project(self, owner: Owner) -> None:
        self._generation += 1
        directory = self.root / f"..2024_01_01_00_00_{self._generation:02d}"
        directory.mkdir()
        (directory / "token").write_text(dev_token(owner.namespace, owner.agent) + "\n")
        staged = self.root / "..data_tmp"
        staged.symlink_to(directory.name)
        os.replace(staged, self.root / "..data")
        if not self.path.is_symlink():
            self.path.symlink_to("..data/token")

    @property
    def current(self) -> Path:
        return self.root / "..data" / "token"


@pytest.fixture
def projected(tmp_path: Path) -> ProjectedToken:
    token = ProjectedToken(tmp_path / "serviceaccount")
    token.root.mkdir()
    token.project(SUPPORT)
    return token


@pytest.fixture
async def memory(proxy_process: ServiceProcess, projected: ProjectedToken) -> AsyncIterator[httpx.AsyncClient]:
    launcher = Launcher(
        launcher_settings(proxy_process.base_url, projected.path), serve_host="127.0.0.1", serve=serve_in_background
    )
    await launcher.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.memory_port}", timeout=10) as client:
            yield client
    finally:
        await launcher.stop()


def _stored(valkey: ValkeyProcess, owner: Owner, conversation: str) -> int:
    return int(valkey.client().llen(session_key(owner, conversation)))


async def test_a_rotated_token_is_used_from_the_next_call(
    memory: httpx.AsyncClient, projected: ProjectedToken, valkey_server: ValkeyProcess
) -> None:
    assert (await memory.post("/v1/conversations/c1/entries", json=ENTRY)).status_code == 200
    projected.project(BILLING)
    assert (await memory.post("/v1/conversations/c1/entries", json=ENTRY)).status_code == 200
    projected.project(SUPPORT)
    read = await memory.get("/v1/conversations/c1/entries")
    assert read.status_code == 200 and len(read.json()["entries"]) == 1
    assert (_stored(valkey_server, SUPPORT, "c1"), _stored(valkey_server, BILLING, "c1")) == (1, 1)


async def test_a_token_rewritten_in_place_is_used_from_the_next_call(
    memory: httpx.AsyncClient, projected: ProjectedToken, valkey_server: ValkeyProcess
) -> None:
    assert (await memory.post("/v1/conversations/c2/entries", json=ENTRY)).status_code == 200
    projected.current.write_text(dev_token(BILLING.namespace, BILLING.agent) + "\n")
    assert (await memory.post("/v1/conversations/c2/entries", json=ENTRY)).status_code == 200
    assert (_stored(valkey_server, SUPPORT, "c2"), _stored(valkey_server, BILLING, "c2")) == (1, 1)


async def test_a_token_that_cannot_be_read_is_a_typed_503_until_it_is_back(
    memory: httpx.AsyncClient, projected: ProjectedToken
) -> None:
    assert (await memory.get("/v1/conversations/c3/entries")).status_code == 200  # cached from here on
    target = projected.current.resolve()
    target.unlink()  # the link now dangles: gone, though it was read a moment ago
    missing = await memory.get("/v1/conversations/c3/entries")
    target.mkdir()  # stat succeeds, reading fails
    unreadable = await memory.get("/v1/conversations/c3/entries")
    for response in (missing, unreadable):
        assert response.status_code == 503
        assert response.json()["error"]["type"] == "backend_unavailable"
        assert "pod token" in response.json()["error"]["message"]
    shutil.rmtree(target)
    target.write_text(dev_token(SUPPORT.namespace, SUPPORT.agent))
    assert (await memory.get("/v1/conversations/c3/entries")).status_code == 200
