"""A hostile client's view of HTTP/1.1: raw sockets, and a reader of the answers that come back."""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import orjson

from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner

OWNER = Owner("team-a", "support-agent")
TOKEN = dev_token(OWNER.namespace, OWNER.agent)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return orjson.loads(self.body)

    @property
    def error_type(self) -> str:
        document = orjson.loads(self.body)
        assert isinstance(document, dict)
        return str(document["error"]["type"])


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request(method: str, target: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {TOKEN}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def read_answer(stream: BinaryIO) -> Answer:
    """One answer from a connection; raises ConnectionError when the server closed it first."""
    status_line = stream.readline()
    if not status_line:
        raise ConnectionError("closed before an answer")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := stream.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = stream.read(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        parts = []
        while (size := int(stream.readline().split(b";")[0], 16)) > 0:
            parts.append(stream.read(size))
            stream.readline()
        stream.readline()
        body = b"".join(parts)
    else:
        body = b""
    return Answer(status, headers, body)


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (reading and dropping whatever it sends), or None if it
    was still open after ``seconds``."""
    started = time.monotonic()
    deadline = started + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return time.monotonic() - started
        except TimeoutError:
            return None
        except ConnectionResetError:
            return time.monotonic() - started
    return None


def worker_pid(main_pid: int, timeout: float = 10.0) -> int:
    """The (one) worker process granian started for the proxy ``main_pid``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{main_pid}/task/{main_pid}/children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.05)
    raise AssertionError(f"proxy {main_pid} has no worker process")


def memory_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")
