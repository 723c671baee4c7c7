"""Registry membership, resolved server-side from the AgentRegistry objects (never from the request).

Cached briefly: a change to a registry takes effect within the cache period. When the API server
cannot be asked, membership is unknown and a shared-scope request fails closed (503) instead of
falling back to anything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Protocol

import httpx
import orjson

from sessionmem_core import kube
from sessionmem_core.errors import AuthUnavailable
from sessionmem_core.keys import Owner


class Membership(Protocol):
    async def registry_of(self, owner: Owner) -> str | None: ...


class KubeRegistryMembership:
    def __init__(self, http: httpx.AsyncClient, bearer: Any, cache_seconds: float = 10.0) -> None:
        self._http = http
        self._bearer = bearer
        self._cache_seconds = cache_seconds
        self._registries: list[Mapping[str, Any]] = []
        self._fetched_at = float("-inf")
        self._lock = asyncio.Lock()

    async def registry_of(self, owner: Owner) -> str | None:
        registries = await self._current()
        return kube.registry_for(owner.namespace, owner.agent, registries)

    async def _current(self) -> list[Mapping[str, Any]]:
        if time.monotonic() - self._fetched_at < self._cache_seconds:
            return self._registries
        async with self._lock:
            if time.monotonic() - self._fetched_at < self._cache_seconds:
                return self._registries
            path = f"/apis/{kube.GROUP}/{kube.VERSION}/{kube.REGISTRY_PLURAL}"
            try:
                response = await self._http.get(path, headers={"Authorization": f"Bearer {self._bearer()}"})
            except (httpx.HTTPError, OSError) as exc:
                raise AuthUnavailable(f"registry membership unavailable: {type(exc).__name__}") from exc
            if response.status_code != 200:
                raise AuthUnavailable(f"registry membership unavailable: HTTP {response.status_code}")
            self._registries = list(orjson.loads(response.content).get("items", []))
            self._fetched_at = time.monotonic()
            return self._registries
