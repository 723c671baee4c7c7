"""``python -m sessionmem_proxy`` with several workers (granian's worker processes): the connections
spread over them and each serves, a dead worker replaced, SIGTERM stopping them all cleanly, and a proxy
that cannot start (a taken port, a bad setting) exiting non-zero with its reason instead of restarting
forever."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sessionmem_core import env
from sessionmem_core.devauth import dev_token
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess, free_port


def _proxy_env(valkey: ValkeyProcess, port: int, workers: int) -> dict[str, str]:
    return {
        env.VALKEY_URL: valkey.url,
        env.AUTH_MODE: "dev",
        env.PROXY_HOST: "127.0.0.1",
        env.PROXY_PORT: str(port),
        "SESSIONMEM_PROXY_WORKERS": str(workers),
    }


@pytest.fixture
def two_workers(valkey_server: ValkeyProcess) -> Iterator[ServiceProcess]:
    port = free_port()
    proc = ServiceProcess("sessionmem_proxy", _proxy_env(valkey_server, port, 2), port)
    proc.start()
    yield proc
    proc.stop()


def _children(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children]


def _wait_for_children(pid: int, count: int, exclude: frozenset[int] = frozenset(), timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = [c for c in _children(pid) if c not in exclude]
        if len(children) >= count:
            return children
        time.sleep(0.05)
    raise AssertionError(f"expected {count} worker processes of {pid}, found {_children(pid)}")


def _established_sockets(pid: int, port: int) -> int:
    """Connections to ``port`` that process ``pid`` holds (its fds matched against /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        if local_port == port and fields[3] == "01" and fields[9] in inodes:  # 01: ESTABLISHED
            count += 1
    return count


def _wait_healthy(base_url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(base_url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("proxy did not become healthy")


def test_connections_spread_over_both_workers_and_each_serves(two_workers: ServiceProcess) -> None:
    workers = _wait_for_children(two_workers.pid, 2)
    token = dev_token("team-a", "support-agent")
    clients = [httpx.Client(base_url=two_workers.base_url, timeout=5) for _ in range(32)]
    try:
        for i, client in enumerate(clients):
            answer = client.post(
                f"/v1/conversations/c{i}/entries",
                json={"entries": [{"role": "user", "content": f"hello {i}"}]},
                headers={"authorization": f"Bearer {token}"},
            )
            assert answer.status_code == 200, answer.text
        held = {pid: _established_sockets(pid, two_workers.port) for pid in workers}
        assert sum(held.values()) == 32
        assert all(count > 0 for count in held.values()), f"every worker holds some connections: {held}"
        reread = clients[0].get("/v1/conversations/c31/entries", headers={"authorization": f"Bearer {token}"})
        assert [e["content"] for e in reread.json()["entries"]] == ["hello 31"], "workers share one store"
    finally:
        for client in clients:
            client.close()


def test_a_worker_that_dies_is_replaced(two_workers: ServiceProcess) -> None:
    workers = _wait_for_children(two_workers.pid, 2)
    time.sleep(5.5)  # past start-up: a death now is a crash to recover from, not a bad configuration
    os.kill(workers[0], signal.SIGKILL)
    replacement = _wait_for_children(two_workers.pid, 1, exclude=frozenset(workers))
    assert len(_children(two_workers.pid)) == 2 and replacement[0] not in workers
    _wait_healthy(two_workers.base_url)


def test_sigterm_stops_every_worker_and_the_proxy_exits_cleanly(valkey_server: ValkeyProcess) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sessionmem_proxy"],
        env={**os.environ, **_proxy_env(valkey_server, port, 2)},
        start_new_session=True,
    )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}")
        workers = _wait_for_children(proc.pid, 2)
        proc.send_signal(signal.SIGTERM)  # the supervisor alone, as a kubelet's stop does
        assert proc.wait(timeout=20) == 0
        for pid in workers:
            assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_workers_that_cannot_listen_stop_the_proxy_with_an_error(valkey_server: ValkeyProcess) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # no SO_REUSEPORT: nobody else may listen here
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessionmem_proxy"],
            env={**os.environ, **_proxy_env(valkey_server, port, 2)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert code != 0
    assert proc.stderr is not None and b"at start-up" in proc.stderr.read()


def test_a_bad_setting_stops_the_proxy_at_start_up_with_its_reason(valkey_server: ValkeyProcess) -> None:
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "sessionmem_proxy"],
        env={**os.environ, **_proxy_env(valkey_server, port, 2), env.MAX_HEADER_COUNT: "lots"},
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    assert b"bad configuration at start-up" in done.stderr and env.MAX_HEADER_COUNT.encode() in done.stderr


def test_sigterm_lets_the_request_under_way_finish(valkey_server: ValkeyProcess) -> None:
    port = free_port()
    proc = ServiceProcess("sessionmem_proxy", _proxy_env(valkey_server, port, 1), port)
    proc.start()
    try:
        body = b'{"entries":[{"role":"user","content":"hi"}]}'
        head = (
            b"POST /v1/conversations/graceful/entries HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n"
            % (dev_token("team-a", "agent").encode(), len(body))
        )
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(head + body[:10])  # the request is under way: its body is still coming
            deadline = time.monotonic() + 5
            while _established_sockets(_wait_for_children(proc.pid, 1)[0], port) == 0:
                assert time.monotonic() < deadline, "the worker never held the connection"
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGTERM)
            sock.sendall(body[10:])
            answer = sock.makefile("rb").read()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert b'"stored":1' in answer
        assert proc._proc is not None and proc._proc.wait(timeout=20) == 0
    finally:
        proc.stop()
