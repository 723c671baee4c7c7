"""The async client from any event loop, bounded by its timeout, and its retries of 429/503.

Frameworks drive one session object from several loops (the OpenAI Agents SDK's ``Runner.run_sync`` runs a
loop of its own per call, beside the application's), so the client must never reuse a connection, a timer
or a future of another loop. Real stack where the answer is the store's; a scripted HTTP peer (a real
socket server in a thread) where the test needs an answer the stack would not give on demand (a stall, a
429 with a given ``Retry-After``)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from sessionmem_client import (
    AsyncMemoryClient,
    BackendUnavailable,
    InvalidConversationId,
    MemoryClient,
    SessionMemError,
    new_conversation_id,
)
from sessionmem_core.errors import RateLimited
from sessionmem_launcher.server import Launcher

Answer = Callable[[int], bytes | None]  # the n-th request (0-based) -> raw HTTP answer, or None to stall


def memory_url(launcher: Launcher) -> str:
    return f"http://127.0.0.1:{launcher.memory_port}"


def http_answer(status: int, body: Any, *headers: str) -> bytes:
    payload = orjson.dumps(body)
    head = [f"HTTP/1.1 {status} X", "content-type: application/json", f"content-length: {len(payload)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


def info_body(cid: str) -> dict[str, Any]:
    return {"conversationId": cid, "exists": False, "version": 0, "entries": 0, "scope": "session", "ttlSeconds": None}


class ScriptedPeer:
    """An HTTP/1.1 keep-alive server on a free port: each request gets ``answer(n)``; the arrival time of
    every request is recorded."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.arrivals: list[float] = []
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(connection)
            threading.Thread(target=self._connection, args=(connection,), daemon=True).start()

    def _connection(self, connection: socket.socket) -> None:
        buffer = b""
        while not self._stop.is_set():
            try:
                data = connection.recv(65536)
            except OSError:
                return
            if not data:
                return
            buffer += data
            while b"\r\n\r\n" in buffer:
                head, _, rest = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(rest) < length:
                    break
                buffer = rest[length:]
                self.arrivals.append(time.monotonic())
                answer = self._answer(len(self.arrivals) - 1)
                if answer is None:
                    return  # stall: keep the connection open, never answer
                connection.sendall(answer)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for connection in self._held:
            connection.close()


@pytest.fixture
def peer_factory() -> Iterator[Callable[[Answer], ScriptedPeer]]:
    peers: list[ScriptedPeer] = []

    def make(answer: Answer) -> ScriptedPeer:
        peers.append(ScriptedPeer(answer))
        return peers[-1]

    yield make
    for peer in peers:
        peer.close()


async def test_one_async_client_serves_run_sync_loops_then_asyncio_run(launcher: Launcher) -> None:
    """What ``Runner.run_sync`` does: a loop per call in another thread, while the application's loop
    keeps the same client; then a plain ``asyncio.run``. Every call answers (none waits for a connection
    of a loop that is gone)."""
    cid = new_conversation_id()
    memory = AsyncMemoryClient(memory_url(launcher), timeout=5)

    async def append_and_count(turn: str) -> int:
        await memory.append_exchange(cid, f"u {turn}", f"a {turn}", turn_id=turn)
        return len((await memory.export(cid)).entries)

    def in_new_loop(turn: str) -> int:
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(asyncio.wait_for(append_and_count(turn), 20))
        finally:
            loop.close()

    assert await append_and_count("t0") == 2  # the test's loop opens (and pools) a connection
    assert await asyncio.to_thread(in_new_loop, "t1") == 4
    assert await asyncio.to_thread(in_new_loop, "t2") == 6
    assert await asyncio.to_thread(asyncio.run, asyncio.wait_for(append_and_count("t3"), 20)) == 8
    assert await append_and_count("t4") == 10, "and the test's own loop still works"
    await memory.aclose()


def run_guarded(call: Callable[[], Any], guard: float = 10) -> Any:
    """``asyncio.run(call())`` in a thread of its own, failing (not hanging) when it has not ended within
    ``guard`` seconds; the call's exception is raised here."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, asyncio.run(call())))
        except BaseException as exc:
            outcome.append((False, exc))

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(guard)
    assert not runner.is_alive(), f"the call was still waiting after {guard} s"
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def test_a_stalled_answer_on_a_later_loop_times_out(peer_factory: Callable[[Answer], ScriptedPeer]) -> None:
    """The first two loops' calls are answered; on a third loop the peer never answers: the call fails with
    BackendUnavailable at its 0.5 s timeout, long before the hang guard."""
    cid = new_conversation_id()
    peer = peer_factory(lambda n: http_answer(200, info_body(cid)) if n < 2 else None)
    memory = AsyncMemoryClient(peer.url, timeout=0.5)
    assert run_guarded(lambda: memory.info(cid)).conversation_id == cid
    assert run_guarded(lambda: memory.info(cid)).conversation_id == cid
    with pytest.raises(BackendUnavailable):
        run_guarded(lambda: memory.info(cid))


async def test_retries_a_429_after_its_retry_after(peer_factory: Callable[[Answer], ScriptedPeer]) -> None:
    cid = new_conversation_id()
    limited = http_answer(429, {"error": {"type": "rate_limited", "message": "slow down"}}, "retry-after: 1")
    peer = peer_factory(lambda n: limited if n == 0 else http_answer(200, info_body(cid)))
    async with AsyncMemoryClient(peer.url) as memory:
        assert (await memory.info(cid)).conversation_id == cid
    assert len(peer.arrivals) == 2
    assert peer.arrivals[1] - peer.arrivals[0] >= 0.95, "waited the Retry-After before sending again"


def test_sync_client_retries_a_503_overloaded(peer_factory: Callable[[Answer], ScriptedPeer]) -> None:
    cid = new_conversation_id()
    busy = http_answer(503, {"error": {"type": "overloaded", "message": "busy"}}, "retry-after: 0")
    peer = peer_factory(lambda n: busy if n < 2 else http_answer(200, info_body(cid)))
    with MemoryClient(peer.url) as memory:
        assert memory.info(cid).conversation_id == cid
    assert len(peer.arrivals) == 3


async def test_retries_are_bounded_and_end_in_the_typed_error(peer_factory: Callable[[Answer], ScriptedPeer]) -> None:
    limited = http_answer(429, {"error": {"type": "rate_limited", "message": "slow down"}}, "retry-after: 0")
    peer = peer_factory(lambda n: limited)
    async with AsyncMemoryClient(peer.url, retries=2) as memory:
        with pytest.raises(RateLimited):
            await memory.info(new_conversation_id())
    assert len(peer.arrivals) == 3, "the first attempt and two retries"


async def test_a_503_of_an_append_without_a_key_is_not_repeated(
    peer_factory: Callable[[Answer], ScriptedPeer],
) -> None:
    """A backend failure may come after the write: an append that cannot be de-duplicated is not sent twice."""
    unavailable = http_answer(503, {"error": {"type": "backend_unavailable", "message": "valkey"}}, "retry-after: 0")
    peer = peer_factory(lambda n: unavailable)
    async with AsyncMemoryClient(peer.url) as memory:
        with pytest.raises(BackendUnavailable):
            await memory.append(new_conversation_id(), [{"role": "user", "content": "hi"}])
        assert len(peer.arrivals) == 1
        with pytest.raises(BackendUnavailable):
            await memory._append_batch(
                new_conversation_id(), [{"role": "user", "content": "hi"}], idempotency_key="k-1"
            )
    assert len(peer.arrivals) == 2 + 4, "an append with an idempotency key is retried (4 retries)"


def test_an_invalid_conversation_id_is_a_value_error() -> None:
    with MemoryClient("http://127.0.0.1:9") as memory, pytest.raises(ValueError) as raised:
        memory.read("a/b")
    assert isinstance(raised.value, InvalidConversationId) and isinstance(raised.value, SessionMemError)
