"""The request parameters the proxy's routes share, declared once (names, bounds, descriptions)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Path, Query

from sessionmem_core import api, env
from sessionmem_core.keys import Scope

ConversationIdPath = Annotated[str, Path(description="Conversation id: see the id rule in sessionmem_core.ids")]
CapQuery = Annotated[
    int, Query(alias=api.CAP_PARAM, ge=1, le=env.MAX_CAP, description="Entries kept (LTRIM) after this write")
]
TtlQuery = Annotated[
    int, Query(alias=api.TTL_PARAM, ge=1, le=env.MAX_TTL_SECONDS, description="TTL in seconds this write refreshes")
]
RedactQuery = Annotated[
    str, Query(description="Comma-separated redactors applied before storing (email, phone, card, or configured)")
]
ScopeQuery = Annotated[Scope, Query(description="Requested scope; shared applies only to verified registry members")]
AuthHeader = Annotated[str | None, Header()]
CapabilityHeader = Annotated[str | None, Header()]
TraceHeader = Annotated[str | None, Header(include_in_schema=False)]
