"""The memory backend's health as the operator sees it: the proxy's readiness (``/readyz``), which answers
503 with the cause while Valkey is down.

MemoryReady (status.py) follows it: every agent's memory call goes through that proxy, so a proxy that
reports its backend down, or cannot be reached at all, means no memory call can succeed. The watcher
probes every ``memoryHealthSeconds`` and reports each change (down, up) once: a log line with the proxy's
address and the cause, and a resync of every agent so their conditions say the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from sessionmem_core import api
from sessionmem_core.errors import from_wire
from sessionmem_operator.wiring import MemoryReason

# A probe that takes longer than this counts as a failure: the launchers' own calls time out sooner.
PROBE_TIMEOUT_SECONDS = 3.0
# The proxy's readiness answer is a few bytes; more is not read.
_MAX_ANSWER_BYTES = 4096

_LOG = logging.getLogger("sessionmem.operator.backend")


@dataclass(frozen=True, slots=True)
class BackendHealth:
    """``ok`` None: not known (not probed yet, or probing is off), and MemoryReady says only the wiring."""

    ok: bool | None
    reason: MemoryReason | None = None
    message: str = ""

    def same_state(self, other: BackendHealth) -> bool:
        return (self.ok, self.reason) == (other.ok, other.reason)


UNKNOWN = BackendHealth(None)


def ready_url(proxy_url: str) -> str:
    return proxy_url.rstrip("/") + api.PROXY_READY_PATH


def judge(proxy_url: str, status: int | None, body: bytes, failure: BaseException | None = None) -> BackendHealth:
    """The health an answer (or a failure to get one) means. Pure, so every case has a unit test."""
    url = ready_url(proxy_url)
    if failure is not None:
        cause = f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__
        return BackendHealth(
            False,
            MemoryReason.PROXY_UNREACHABLE,
            f"the memory proxy at {url} cannot be reached ({cause}), so no memory call can succeed. Its pods "
            "are not ready while Valkey is down: see `kubectl get pods` and the proxy's log in the chart's "
            "namespace",
        )
    if status == 200:
        return BackendHealth(True)
    cause = str(from_wire(status or 0, body))
    return BackendHealth(
        False,
        MemoryReason.MEMORY_BACKEND_UNAVAILABLE,
        f"the memory proxy at {url} reports its backend down (HTTP {status}: {cause}): every memory call "
        "fails until it is back. See the proxy's log and `kubectl describe` of the Valkey pod and its volume",
    )


async def probe(session: aiohttp.ClientSession, proxy_url: str) -> BackendHealth:
    try:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)
        async with session.get(ready_url(proxy_url), timeout=timeout, allow_redirects=False) as answer:
            body = await answer.content.read(_MAX_ANSWER_BYTES)
            return judge(proxy_url, answer.status, body)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return judge(proxy_url, None, b"", exc)


@dataclass
class BackendWatch:
    """The proxy's last known health, kept up to date by ``run`` (one task per operator)."""

    proxy_url: str
    interval: float
    current: BackendHealth = UNKNOWN

    async def check(self, session: aiohttp.ClientSession) -> bool:
        """Probe once; True when the state changed (the change is logged, once)."""
        health = await probe(session, self.proxy_url)
        changed = not health.same_state(self.current)
        first = self.current.ok is None
        self.current = health
        if changed and health.ok is False:
            _LOG.warning("memory backend down: %s", health.message)
        elif changed and health.ok and not first:
            _LOG.info("memory backend up again: the proxy at %s reports ready", ready_url(self.proxy_url))
        return changed

    async def run(self, session: aiohttp.ClientSession, on_change: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                if await self.check(session):
                    await on_change()
            except Exception:
                # Fail open for the loop: one broken round must not end the watch for good.
                _LOG.exception("checking the memory backend failed; next check in %ss", self.interval)
