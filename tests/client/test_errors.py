"""Typed errors through the client against the real stack (client -> in-process launcher -> real proxy
process -> real valkey-server): what docs/client.md promises for each answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sessionmem_client import AsyncMemoryClient, Unauthenticated, UserCapabilityRequired
from sessionmem_core import env
from sessionmem_core.errors import from_wire
from sessionmem_launcher.server import Launcher
from tests.conftest import launcher_settings
from tests.support.processes import ServiceProcess
from tests.support.serving import serve_in_background


@pytest.fixture
async def per_user_launcher(
    proxy_process: ServiceProcess, dev_token_file: Path, demo_agent: int
) -> AsyncIterator[Launcher]:
    settings = launcher_settings(
        proxy_process.base_url, dev_token_file, **{env.AGENT_PORT: str(demo_agent), env.PER_USER: "true"}
    )
    instance = Launcher(settings, serve_host="127.0.0.1", serve=serve_in_background)
    await instance.start()
    yield instance
    await instance.stop()


async def test_a_per_user_agent_without_capability_raises_user_capability_required(
    per_user_launcher: Launcher,
) -> None:
    url = f"http://127.0.0.1:{per_user_launcher.memory_port}"
    async with AsyncMemoryClient(url) as memory:
        with pytest.raises(UserCapabilityRequired) as raised:
            await memory.read("per-user-conversation")
    # The documented family: an Unauthenticated 401, with the precise type on top.
    assert isinstance(raised.value, Unauthenticated)
    assert (raised.value.status, raised.value.error_type) == (401, "user_capability_required")


def test_user_capability_required_is_rebuilt_from_the_wire_without_the_launcher() -> None:
    """The client process never imports the launcher: the mapping must live in the contract's errors."""
    body = b'{"error": {"type": "user_capability_required", "message": "send the header"}}'
    rebuilt = from_wire(401, body)
    assert type(rebuilt) is UserCapabilityRequired
    assert rebuilt.message == "send the header"
