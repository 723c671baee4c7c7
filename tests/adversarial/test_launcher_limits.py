"""The launcher as users start it (``python -m sessionmem_launcher`` with the operator's env) in front of the
real proxy process and a real valkey-server, attacked with raw sockets: header floods, slowloris, idle
connections, oversize bodies and URLs, slow bodies, pipelining, more requests than it takes in flight.

Every limit is set small in the environment, so each test runs in seconds; docs/limits-launcher.md says
which limit hyper (inside granian) enforces and which the launcher's own code does.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from sessionmem_core import env
from tests.support.processes import ServiceProcess
from tests.support.valkey import free_port

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
MAX_BODY = 64 * 1024
MAX_URL = 1024
MAX_HEADERS = 32
MAX_HEADER_BYTES = 16 * 1024
MAX_IN_FLIGHT = 2
MIB = 1024 * 1024
# A connection refused by a timeout must be closed by this much past it (scheduling on a shared machine).
SLACK = 2.0


class SilentAgent:
    """An agent that accepts turns and never answers: each turn stays in flight until the agent timeout."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(connection)

    def close(self) -> None:
        self._listener.close()
        for connection in self._held:
            connection.close()


@pytest.fixture
def launcher_agent() -> Iterator[SilentAgent]:
    agent = SilentAgent()
    yield agent
    agent.close()


@pytest.fixture
def launcher_process(
    proxy_process: ServiceProcess, dev_token_file: Path, launcher_agent: SilentAgent
) -> Iterator[ServiceProcess]:
    memory_port = free_port()
    proc = ServiceProcess(
        "sessionmem_launcher",
        {
            env.PROXY_URL: proxy_process.base_url,
            env.TOKEN_PATH: str(dev_token_file),
            env.NAMESPACE: "team-a",
            env.AGENT: "support-agent",
            env.LAUNCHER_PORT: str(memory_port),
            env.SERVE_PORT: str(free_port()),
            env.AGENT_PORT: str(launcher_agent.port),
            env.AGENT_TIMEOUT_SECONDS: "30",
            env.HEADER_TIMEOUT_SECONDS: str(HEADER_TIMEOUT),
            env.IDLE_TIMEOUT_SECONDS: str(HEADER_TIMEOUT),
            env.BODY_TIMEOUT_SECONDS: str(BODY_TIMEOUT),
            env.MAX_REQUEST_BODY_BYTES: str(MAX_BODY),
            env.MAX_URL_BYTES: str(MAX_URL),
            env.MAX_HEADER_COUNT: str(MAX_HEADERS),
            env.MAX_HEADER_BYTES: str(MAX_HEADER_BYTES),
            env.MAX_CONNECTIONS: str(MAX_IN_FLIGHT),
        },
        memory_port,
    )
    proc.start()
    yield proc
    proc.stop()


def _ports(launcher: ServiceProcess) -> tuple[int, int]:
    return int(launcher.env[env.LAUNCHER_PORT]), int(launcher.env[env.SERVE_PORT])


def _memory_kib(pid: int, field: str) -> int:
    """VmRSS (now) or VmHWM (the peak since start) of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def _answer(sock: socket.socket, deadline: float) -> bytes:
    """What the server sends until it closes or a whole answer head and its declared body arrived."""
    data = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            lengths = [
                int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")
            ]
            if lengths and len(body) >= lengths[0]:
                break
    return data


def _flood(port: int, total: int) -> bytes:
    """Streams one endless header (up to ``total`` bytes) and returns the server's answer: reading it as
    soon as there is one, since the server stops reading a connection it refused."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    chunk = b"a" * 65536
    sent = 0
    prefix = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-flood: "
    pending = prefix
    deadline = time.monotonic() + 30
    try:
        while sent < total and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 1.0)
            if readable:
                break
            if writable:
                try:
                    sent += sock.send(pending)
                except (BlockingIOError, InterruptedError):
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
                pending = chunk
        sock.setblocking(True)
        return _answer(sock, time.monotonic() + 10)
    finally:
        sock.close()


def test_header_floods_on_both_ports_are_refused_431_and_cost_no_memory(launcher_process: ServiceProcess) -> None:
    memory_port, serve_port = _ports(launcher_process)
    with httpx.Client() as client:  # warm both ports first, so the peak counts the floods only
        for port in (memory_port, serve_port):
            assert client.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    peak_before = _memory_kib(launcher_process.pid, "VmHWM")
    answers: list[bytes] = []
    floods = [
        threading.Thread(target=lambda p=p: answers.append(_flood(p, 64 * MIB))) for p in (memory_port, serve_port) * 4
    ]
    for flood in floods:
        flood.start()
    for flood in floods:
        flood.join(60)
    assert len(answers) == len(floods)
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    grown = _memory_kib(launcher_process.pid, "VmHWM") - peak_before
    assert grown < 16 * 1024, f"peak RSS grew {grown} KiB under eight 64 MiB header floods"
    with httpx.Client() as client:
        assert client.get(f"http://127.0.0.1:{serve_port}/healthz").status_code == 200


def test_too_many_headers_long_urls_and_big_bodies_are_typed_refusals(launcher_process: ServiceProcess) -> None:
    memory_port, serve_port = _ports(launcher_process)
    many_headers = {f"x-h{i}": "1" for i in range(MAX_HEADERS + 1)}
    with httpx.Client(timeout=10) as client:
        for port in (memory_port, serve_port):
            base = f"http://127.0.0.1:{port}"
            headers = client.get(f"{base}/healthz", headers=many_headers)
            url = client.get(f"{base}/v1/conversations/c1/entries?limit=1&pad={'x' * MAX_URL}")
            declared = client.post(f"{base}/v1/conversations/c1/entries", content=b"x" * (MAX_BODY + 1))
            streamed = client.post(f"{base}/v1/conversations/c1/entries", content=iter([b"x" * MAX_BODY, b"x"]))
            for response, status, error in (
                (headers, 431, "headers_too_large"),
                (url, 414, "uri_too_long"),
                (declared, 413, "payload_too_large"),
                (streamed, 413, "payload_too_large"),
            ):
                assert response.status_code == status, (port, response.status_code, response.text)
                assert response.json()["error"]["type"] == error
        # Just within each limit, the same calls go through.
        fits = client.post(
            f"http://127.0.0.1:{memory_port}/v1/conversations/c1/entries",
            content=orjson.dumps({"entries": [{"role": "user", "content": "x" * (MAX_BODY - 100)}]}),
            headers={f"x-h{i}": "1" for i in range(MAX_HEADERS - 8)},  # httpx adds its own
        )
    assert fits.status_code == 200, fits.text


def _closed_after(sock: socket.socket, limit: float) -> float | None:
    """Seconds until the server closed ``sock`` (EOF or reset), or None if it was still open at ``limit``."""
    started = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def test_slowloris_and_idle_connections_are_closed_on_time_while_others_are_served(
    launcher_process: ServiceProcess,
) -> None:
    memory_port, serve_port = _ports(launcher_process)
    results: dict[str, float | None] = {}

    def slowloris(port: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port))
        started = time.monotonic()
        try:
            for byte in b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 200:
                sock.send(bytes([byte]))
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            results[f"slowloris-{port}"] = time.monotonic() - started
            sock.close()
            return
        closed = _closed_after(sock, HEADER_TIMEOUT + SLACK)
        results[f"slowloris-{port}"] = None if closed is None else time.monotonic() - started
        sock.close()

    def idle(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            results[f"idle-{port}"] = _closed_after(sock, HEADER_TIMEOUT + SLACK)

    attackers = [threading.Thread(target=f, args=(p,)) for f in (slowloris, idle) for p in (memory_port, serve_port)]
    for attacker in attackers:
        attacker.start()
    served = []
    with httpx.Client(timeout=5) as client:
        while any(a.is_alive() for a in attackers):
            served.append(client.get(f"http://127.0.0.1:{serve_port}/healthz").status_code)
            served.append(client.get(f"http://127.0.0.1:{memory_port}/healthz").status_code)
            time.sleep(0.05)
    for attacker in attackers:
        attacker.join()
    assert len(results) == 4, results
    for name, seconds in results.items():
        assert seconds is not None, f"{name}: still open {HEADER_TIMEOUT + SLACK} s after the head timeout"
        assert HEADER_TIMEOUT * 0.9 <= seconds <= HEADER_TIMEOUT + SLACK, (name, seconds)
    assert served and set(served) == {200}, "other clients were served all along"


def test_a_body_that_does_not_arrive_in_time_is_a_typed_408(launcher_process: ServiceProcess) -> None:
    memory_port, _ = _ports(launcher_process)
    with socket.create_connection(("127.0.0.1", memory_port)) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/conversations/c1/entries HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        answer = _answer(sock, started + BODY_TIMEOUT + SLACK + 1)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer
    assert BODY_TIMEOUT * 0.9 <= waited <= BODY_TIMEOUT + SLACK, waited


def test_a_body_cut_short_by_its_client_is_never_forwarded(launcher_process: ServiceProcess) -> None:
    """A client that declares a body, sends a complete-looking prefix of it and stops sending: a typed 400
    (granian's body iterator would just end there), and nothing of it is stored."""
    memory_port, _ = _ports(launcher_process)
    whole = orjson.dumps({"entries": [{"role": "user", "content": "cut short"}]})
    with socket.create_connection(("127.0.0.1", memory_port)) as sock:
        head = b"POST /v1/conversations/cut/entries HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        sock.sendall(head + b"content-length: %d\r\n\r\n" % (len(whole) + 10) + whole)
        sock.shutdown(socket.SHUT_WR)
        answer = _answer(sock, time.monotonic() + BODY_TIMEOUT + SLACK + 1)
    assert answer.startswith(b"HTTP/1.1 400") and b"invalid_request" in answer, answer[:300]
    with httpx.Client(base_url=f"http://127.0.0.1:{memory_port}") as client:
        read = client.get("/v1/conversations/cut/entries")
    assert read.status_code == 200 and read.json()["entries"] == [], read.text


def test_pipelined_appends_are_stored_in_order_and_answered_in_order(launcher_process: ServiceProcess) -> None:
    memory_port, _ = _ports(launcher_process)
    count = 30
    requests = b""
    for n in range(count):
        body = orjson.dumps({"entries": [{"role": "user", "content": f"m{n}", "id": f"p-{n}"}]})
        requests += (
            b"POST /v1/conversations/piped/entries HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + b"content-length: %d\r\n\r\n" % len(body)
            + body
        )
    requests += b"GET /v1/conversations/piped/entries?limit=100 HTTP/1.1\r\nhost: x\r\n\r\n"
    requests += b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", memory_port)) as sock:
        sock.sendall(requests)
        sock.settimeout(20)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    answers = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")
        )
        answers.append((head.split(b" ")[1], orjson.loads(rest[:length])))
        data = rest[length:]
    assert len(answers) == count + 2
    versions = [body["version"] for status, body in answers[:count] if status == b"200"]
    assert versions == list(range(1, count + 1)), "each append answered in the order sent"
    status, history = answers[count]
    assert status == b"200" and [e["content"] for e in history["entries"]] == [f"m{n}" for n in range(count)]
    assert answers[count + 1] == (b"200", {"status": "ok"}), "the read before it was answered first"


def test_requests_over_the_in_flight_limit_are_a_typed_503(
    launcher_process: ServiceProcess, launcher_agent: SilentAgent
) -> None:
    _, serve_port = _ports(launcher_process)
    # Turns held by an agent that never answers fill the launcher's requests in flight.
    held = [socket.create_connection(("127.0.0.1", serve_port)) for _ in range(MAX_IN_FLIGHT)]
    try:
        for sock in held:
            sock.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        deadline = time.monotonic() + 10
        while len(launcher_agent._held) < MAX_IN_FLIGHT and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(launcher_agent._held) == MAX_IN_FLIGHT, "the held turns reached the agent"
        with httpx.Client(timeout=5) as client:
            refused = client.get(f"http://127.0.0.1:{serve_port}/healthz")
    finally:
        for sock in held:
            sock.close()
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "overloaded"


def test_a_malformed_chunked_body_is_a_typed_400_on_both_ports(launcher_process: ServiceProcess) -> None:
    for port in _ports(launcher_process):
        head = (
            "POST /v1/conversations/chunks/entries HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
            "x-conversation-id: chunks\r\ncontent-type: application/json\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(head.encode() + b"ZZ\r\nabc\r\n0\r\n\r\n")
            status_line = sock.makefile("rb").readline()
        assert status_line.split()[1] == b"400", (port, status_line)


def test_bodies_held_back_take_no_slot_on_the_serving_port(launcher_process: ServiceProcess) -> None:
    """More heads promising a body that never comes than the launcher has slots (yet fewer than the
    connections granian takes, twice the slots): the caller after them is served."""
    _, serve_port = _ports(launcher_process)
    held = [socket.create_connection(("127.0.0.1", serve_port)) for _ in range(MAX_IN_FLIGHT + 1)]
    try:
        for sock in held:
            sock.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n")
        time.sleep(0.2)
        with httpx.Client(timeout=5) as client:
            served = client.get(f"http://127.0.0.1:{serve_port}/healthz")
    finally:
        for sock in held:
            sock.close()
    assert served.status_code == 200, served.text


def test_a_repeated_conversation_field_is_a_typed_400_never_relayed(
    launcher_process: ServiceProcess, launcher_agent: SilentAgent
) -> None:
    _, serve_port = _ports(launcher_process)
    body = b'{"input":"hi"}'
    head = (
        "POST / HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-conversation-id: mine\r\n"
        f"x-conversation-id: theirs\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", serve_port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        answer = _answer(sock, time.monotonic() + 5)
    assert answer.split(b"\r\n", 1)[0].split()[1] == b"400", answer
    assert b"malformed_request" in answer
    assert launcher_agent._held == [], "the turn reached the agent"


def test_a_path_that_climbs_never_reaches_the_agent(
    launcher_process: ServiceProcess, launcher_agent: SilentAgent
) -> None:
    _, serve_port = _ports(launcher_process)
    for target in ("/public%2F..%2Fadmin", "/public/../admin", "/%2e%2e/admin", "/./admin"):
        with socket.create_connection(("127.0.0.1", serve_port), timeout=10) as sock:
            sock.sendall(f"GET {target} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            answer = _answer(sock, time.monotonic() + 5)
        assert answer.split(b"\r\n", 1)[0].split()[1] == b"400", (target, answer)
        assert b"malformed_request" in answer, (target, answer)
    assert launcher_agent._held == [], "a climbing path reached the agent"


def test_an_escaped_slash_is_read_as_a_separator_on_both_ports(
    launcher_process: ServiceProcess, launcher_agent: SilentAgent
) -> None:
    """granian hands the launcher the decoded path only (docs/limits.md, "Paths are matched decoded"): on the
    memory port an escape that leaves a ``/`` in an id is a typed 400 and one that spells the route is that
    route; on the serving port the agent is handed the decoded path, its ``/`` as a ``/``."""
    memory_port, serve_port = _ports(launcher_process)
    for target, status, kind in (
        ("/v1/conversations/a%2Fb/entries", b"400", b"invalid_conversation_id"),
        ("/v1/conversations/escaped%2Fentries", b"200", b'"entries"'),
    ):
        with socket.create_connection(("127.0.0.1", memory_port), timeout=10) as sock:
            sock.sendall(f"GET {target} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            answer = _answer(sock, time.monotonic() + 5)
        assert answer.split(b"\r\n", 1)[0].split()[1] == status and kind in answer, (target, answer)

    with socket.create_connection(("127.0.0.1", serve_port), timeout=10) as sock:
        sock.sendall(b"GET /public%2Fx HTTP/1.1\r\nhost: x\r\n\r\n")
        deadline = time.monotonic() + 5
        while not launcher_agent._held and time.monotonic() < deadline:
            time.sleep(0.02)
        assert launcher_agent._held, "the request never reached the agent"
        agent_side = launcher_agent._held[0]
        agent_side.settimeout(5)
        relayed = agent_side.recv(65536)
    assert relayed.startswith(b"GET /public/x HTTP/1.1\r\n"), relayed[:200]
