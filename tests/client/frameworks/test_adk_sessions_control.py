"""The control of ``test_adk_sessions_sessionmem.py``: the same upstream contract tests (bodies unchanged)
with the ``session_service`` fixture rebound to ADK's own ``InMemorySessionService`` (google-adk 2.13.0).
What passes here is what ``SessionmemSessionService`` must pass."""

from __future__ import annotations

import pytest
from google.adk.sessions.base_session_service import BaseSessionService
from google.adk.sessions.in_memory_session_service import InMemorySessionService

from tests.client.frameworks import bindings, upstream


@pytest.fixture
def session_service() -> BaseSessionService:
    return InMemorySessionService()


globals().update(
    bindings.contract_tests(
        upstream.load_file(
            upstream.ADK_SESSION_SERVICE_TESTS.installed(),
            "tests._adk_session_service_ctl",
            {"session_service": session_service},
        )
    )
)
