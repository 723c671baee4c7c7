"""A bounded mixed load (reads and appends) for fault tests and the soak, with the bookkeeping they need:
every outcome by class, when each happened, and every append that was acknowledged (HTTP 200), so the
test can check afterwards that none of them was lost.

Loopback only, bounded twice: by wall time and by a total operation count. A worker that meets an error
pauses briefly (as a real client would), so an outage does not turn into a busy loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import orjson

from sessionmem_core import api

ERROR_PAUSE_SECONDS = 0.02
OK = "200"


@dataclass(frozen=True, slots=True)
class Outcome:
    at: float  # time.monotonic() when the answer (or the error) came back
    op: str  # "append" | "read" | "turn"
    outcome: str  # "200", "503:backend_unavailable", "exc:ConnectError", ...
    memory: str | None = None  # the managed loop's X-Sessionmem-Memory header
    latency_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome == OK


@dataclass
class LoadResult:
    outcomes: list[Outcome] = field(default_factory=list)
    # conversation id -> message ids the server acknowledged (HTTP 200) as stored
    acked: dict[str, set[str]] = field(default_factory=dict)
    # conversation id -> user inputs of managed-loop turns answered with X-Sessionmem-Memory: ok (stored)
    acked_turns: dict[str, set[str]] = field(default_factory=dict)
    started: float = 0.0
    finished: float = 0.0

    @property
    def seconds(self) -> float:
        return max(self.finished - self.started, 1e-9)

    def by_class(self) -> Counter[str]:
        return Counter(f"{o.op} {o.outcome}" for o in self.outcomes)

    def failures(self) -> Counter[str]:
        return Counter(o.outcome for o in self.outcomes if not o.ok)

    def memory_states(self) -> Counter[str]:
        return Counter(o.memory or "-" for o in self.outcomes if o.op == "turn")

    def ok_rate(self) -> float:
        return sum(1 for o in self.outcomes if o.ok) / self.seconds

    def acked_count(self) -> int:
        return sum(len(ids) for ids in self.acked.values()) + sum(len(t) for t in self.acked_turns.values())

    def recovery_after(
        self, t_back: float, op: str | None = None, *, ok: Callable[[Outcome], bool] | None = None
    ) -> Recovery:
        """How the load fared after ``t_back`` (the moment the faulty part was back): the first success,
        and the last failure after it."""
        good = ok or (lambda o: o.ok)
        later = sorted((o for o in self.outcomes if o.at >= t_back and (op is None or o.op == op)), key=lambda o: o.at)
        first_ok = next((o.at - t_back for o in later if good(o)), None)
        last_bad = max((o.at - t_back for o in later if not good(o)), default=None)
        return Recovery(first_ok=first_ok, last_failure=last_bad, after=len(later))

    def window(self, start: float, end: float) -> list[Outcome]:
        return [o for o in self.outcomes if start <= o.at <= end]


@dataclass(frozen=True, slots=True)
class Recovery:
    first_ok: float | None  # seconds after the part was back until the first success
    last_failure: float | None  # seconds after the part was back of the last failure (None: none)
    after: int  # operations answered after the part was back

    @property
    def seconds(self) -> float | None:
        """Time to recovery: the last failure after the part came back, else the first success."""
        if self.last_failure is not None:
            return self.last_failure
        return self.first_ok


def classify_response(response: httpx.Response) -> str:
    if response.status_code == 200:
        return OK
    try:
        kind = str(orjson.loads(response.content)["error"]["type"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        kind = "untyped"
    return f"{response.status_code}:{kind}"


class MixedLoad:
    """``clients`` concurrent workers, each alternating reads and appends at random over ``conversations``
    conversations (ids ``{prefix}-{n}``), against either the memory API (proxy or launcher memory endpoint)
    or the launcher's managed loop (``turns=True``)."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        clients: int = 8,
        conversations: int = 32,
        prefix: str = "load",
        append_ratio: float = 0.5,
        turns: bool = False,
        memory_url: str | None = None,
        timeout_seconds: float = 3.0,
        query: Mapping[str, str] | None = None,
        seed: int = 7,
    ) -> None:
        host = urlsplit(base_url).hostname
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"load targets loopback only, not {host}")
        self.base_url = base_url
        self.headers = dict(headers or {})
        self.clients = clients
        self.conversation_ids = [f"{prefix}-{n}" for n in range(conversations)]
        self.append_ratio = append_ratio
        self.turns = turns
        self.memory_url = memory_url
        self.timeout_seconds = timeout_seconds
        self.query = dict(query or {})
        self._random = random.Random(seed)
        self.result = LoadResult()
        self._stop = asyncio.Event()
        self._ops = 0

    def stop(self) -> None:
        self._stop.set()

    async def run(
        self, seconds: float, max_ops: int, *, min_acked: int = 0, max_seconds: float | None = None
    ) -> LoadResult:
        """Run until ``seconds`` have passed, ``max_ops`` operations were made, or ``stop()``. With
        ``min_acked``, go on past ``seconds`` until that many writes were acknowledged (up to ``max_seconds``,
        default ten times ``seconds``): a test that judges lost writes judges enough of them however slow
        the machine is, instead of however many a fixed time allowed."""
        limits = httpx.Limits(max_connections=self.clients * 2, max_keepalive_connections=self.clients * 2)
        async with httpx.AsyncClient(
            base_url=self.base_url, headers=self.headers, timeout=self.timeout_seconds, limits=limits
        ) as http:
            self.result.started = time.monotonic()
            deadline = self.result.started + seconds
            hard_deadline = self.result.started + (max_seconds if max_seconds is not None else 10 * seconds)
            workers = [
                asyncio.create_task(self._worker(http, w, deadline, hard_deadline, max_ops, min_acked))
                for w in range(self.clients)
            ]
            await asyncio.gather(*workers)
            self.result.finished = time.monotonic()
        return self.result

    def _goes_on(self, deadline: float, hard_deadline: float, max_ops: int, min_acked: int) -> bool:
        if self._stop.is_set() or self._ops >= max_ops:
            return False
        now = time.monotonic()
        return now < deadline or (now < hard_deadline and self.result.acked_count() < min_acked)

    async def _worker(
        self, http: httpx.AsyncClient, worker: int, deadline: float, hard_deadline: float, max_ops: int, min_acked: int
    ) -> None:
        seq = 0
        while self._goes_on(deadline, hard_deadline, max_ops, min_acked):
            self._ops += 1
            seq += 1
            conversation = self._random.choice(self.conversation_ids)
            if self.turns:
                outcome = await self._turn(http, conversation, f"w{worker}-{seq}")
            elif self._random.random() < self.append_ratio:
                outcome = await self._append(http, conversation, f"w{worker}-{seq}")
            else:
                outcome = await self._read(http, conversation)
            self.result.outcomes.append(outcome)
            if not outcome.ok or (outcome.memory not in (None, "ok")):
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), ERROR_PAUSE_SECONDS)

    async def _timed(
        self, op: str, call: Callable[[], Awaitable[httpx.Response]]
    ) -> tuple[httpx.Response | None, Outcome]:
        started = time.monotonic()
        try:
            response = await call()
        except httpx.HTTPError as exc:
            now = time.monotonic()
            return None, Outcome(now, op, f"exc:{type(exc).__name__}", None, (now - started) * 1000)
        now = time.monotonic()
        memory = response.headers.get(api.MEMORY_STATUS_HEADER)
        return response, Outcome(now, op, classify_response(response), memory, (now - started) * 1000)

    async def _append(self, http: httpx.AsyncClient, conversation: str, message_id: str) -> Outcome:
        body = orjson.dumps({"entries": [{"role": "user", "content": f"note {message_id}", "id": message_id}]})
        response, outcome = await self._timed(
            "append",
            lambda: http.post(
                api.entries_path(conversation),
                content=body,
                params=self.query,
                headers={"content-type": "application/json"},
            ),
        )
        if response is not None and outcome.ok:
            self.result.acked.setdefault(conversation, set()).add(message_id)
        return outcome

    async def _read(self, http: httpx.AsyncClient, conversation: str) -> Outcome:
        _, outcome = await self._timed("read", lambda: http.get(api.entries_path(conversation), params={"limit": "10"}))
        return outcome

    async def _turn(self, http: httpx.AsyncClient, conversation: str, tag: str) -> Outcome:
        text = f"turn {tag}"
        body = orjson.dumps({"input": text})
        _, outcome = await self._timed(
            "turn",
            lambda: http.post(
                "/",
                content=body,
                headers={"content-type": "application/json", api.CONVERSATION_ID_HEADER: conversation},
            ),
        )
        if outcome.ok and outcome.memory == "ok":
            self.result.acked_turns.setdefault(conversation, set()).add(text)
        return outcome


def stored_ids(raw_entries: list[bytes]) -> set[str]:
    return {str(orjson.loads(raw)["id"]) for raw in raw_entries}


def stored_user_inputs(raw_entries: list[bytes]) -> set[str]:
    entries = [orjson.loads(raw) for raw in raw_entries]
    return {str(e["content"]) for e in entries if e.get("role") == "user"}


def lost_acknowledged(
    acked: Mapping[str, set[str]],
    read_all: Callable[[str], list[bytes]],
    acked_turns: Mapping[str, set[str]] | None = None,
) -> dict[str, set[str]]:
    """Acknowledged writes missing from storage, by conversation: message ids of 200-acked appends, and the
    user inputs of managed-loop turns that said ``memory: ok`` (``read_all`` gives a conversation's stored
    entries)."""
    lost: dict[str, set[str]] = {}
    turns = acked_turns or {}
    for conversation in set(acked) | set(turns):
        stored = read_all(conversation)
        missing = acked.get(conversation, set()) - stored_ids(stored)
        missing |= turns.get(conversation, set()) - stored_user_inputs(stored)
        if missing:
            lost[conversation] = missing
    return lost
