"""Google ADK's own session-service tests (google-adk 2.13.0; the test file, which ADK's releases do not
ship, is ``upstream.ADK_SESSION_SERVICE_TESTS``, bodies unchanged) on ``SessionmemSessionService`` over the
real stack: the ``session_service`` fixture the bodies take is rebound, nothing else. Its tests that take
that fixture are the contract every ``BaseSessionService`` owes; ``test_adk_sessions_control.py`` runs the
same ones on ADK's own ``InMemorySessionService``, the control."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from google.adk.sessions.base_session_service import BaseSessionService

from sessionmem_client import AsyncMemoryClient
from sessionmem_client.google_adk import SessionmemSessionService
from tests.client.frameworks import bindings, upstream
from tests.client.frameworks.conftest import MemoryStack


@pytest.fixture
async def session_service(memory_stack: MemoryStack) -> AsyncIterator[BaseSessionService]:
    """A service on the stack's agent memory, emptied first (each upstream test had a fresh service)."""
    client = AsyncMemoryClient(memory_stack.memory_url)
    await bindings.forget_everything(client)
    yield SessionmemSessionService(client)
    await client.aclose()


globals().update(
    bindings.contract_tests(
        upstream.load_file(
            upstream.ADK_SESSION_SERVICE_TESTS.installed(),
            "tests._adk_session_service_sm",
            {"session_service": session_service},
        )
    )
)
