"""MemoryReady against the real proxy: for the settings the chart gives both sides, the operator says an
agent's memory calls can succeed exactly when the real proxy (its own process, on a real valkey-server,
configured with the env the chart renders for it) accepts them."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessionmem_core import api, env
from sessionmem_core.capability import mint_capability
from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner
from sessionmem_operator.config import OperatorConfig
from sessionmem_operator.spec import AgentSpec, MemorySpec
from sessionmem_operator.wiring import resolve_memory
from tests.chart.test_lint import Doc, containers, find, names, plain_env, render
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess, free_port

OWNER = Owner(namespace="team-a", agent="support-agent")
PATTERNS = '{"employee-id": "EMP-[0-9]{6}"}'


def agent(memory: MemorySpec) -> AgentSpec:
    return AgentSpec(namespace=OWNER.namespace, name=OWNER.agent, uid="u", generation=1, image="i", memory=memory)


def operator_config(docs: list[Doc], tmp_path: Path) -> OperatorConfig:
    (container,) = containers(find(docs, "Deployment", names()["operator"]))
    variables = plain_env(container)
    local = tmp_path / Path(variables[env.OPERATOR_CONFIG_FILE]).name
    local.write_text(find(docs, "ConfigMap", names()["operator"])["data"][local.name], encoding="utf-8")
    return OperatorConfig.load({**variables, env.OPERATOR_CONFIG_FILE: str(local)})


def proxy_env(docs: list[Doc], valkey: ValkeyProcess, tmp_path: Path, port: int) -> dict[str, str]:
    """The chart's proxy env, with only what a test machine has instead of a pod: the Valkey URL, dev
    identity (no API server here), the port, and the capability key file's path."""
    variables = plain_env(containers(find(docs, "Deployment", names()["proxy"]))[0])
    variables.update(
        {env.VALKEY_URL: valkey.url, env.AUTH_MODE: "dev", env.PROXY_HOST: "127.0.0.1", env.PROXY_PORT: str(port)}
    )
    if env.CAPABILITY_KEY_FILE in variables:
        secret = find(docs, "Secret", f"{names()['proxy']}-capability-key")
        key_file = tmp_path / "capability-key"
        key_file.write_bytes(base64.b64decode(secret["data"]["capability-key"]))
        variables[env.CAPABILITY_KEY_FILE] = str(key_file)
    return variables


@pytest.fixture
def started() -> Iterator[list[ServiceProcess]]:
    processes: list[ServiceProcess] = []
    yield processes
    for process in processes:
        process.stop()


def run_proxy(docs: list[Doc], valkey: ValkeyProcess, tmp_path: Path, started: list[ServiceProcess]) -> str:
    port = free_port()
    process = ServiceProcess("sessionmem_proxy", proxy_env(docs, valkey, tmp_path, port), port)
    process.start()
    started.append(process)
    return process.base_url


def append(base_url: str, redact: tuple[str, ...], headers: dict[str, str] | None = None) -> int:
    query = f"?{api.REDACT_PARAM}={','.join(redact)}" if redact else ""
    auth = {"Authorization": f"Bearer {dev_token(OWNER.namespace, OWNER.agent)}", **(headers or {})}
    body: dict[str, Any] = {"entries": [{"role": "user", "content": "EMP-123456 wrote to a@b.example"}]}
    return httpx.post(f"{base_url}{api.entries_path('c1')}{query}", json=body, headers=auth).status_code


@pytest.mark.parametrize(
    ("patterns", "redact"),
    [
        (None, ("email", "card", "phone")),
        (None, ("email", "employee-id")),
        (PATTERNS, ("email", "employee-id")),
        (PATTERNS, ("badge",)),
    ],
    ids=["built-in", "custom-not-configured", "custom-configured", "other-name"],
)
def test_memory_ready_matches_what_the_proxy_accepts_for_redactors(
    patterns: str | None,
    redact: tuple[str, ...],
    valkey_server: ValkeyProcess,
    tmp_path: Path,
    started: list[ServiceProcess],
) -> None:
    docs = render(*(("--set-json", f"proxy.redactPatterns={patterns}") if patterns else ()))
    resolution = resolve_memory(agent(MemorySpec(redact=redact)), (), operator_config(docs, tmp_path))
    status = append(run_proxy(docs, valkey_server, tmp_path, started), redact)
    assert resolution.ready == (status == 200), (resolution.reason, status)
    assert status in (200, 400)


@pytest.mark.parametrize("capability_key", [False, True], ids=["no-capability-key", "capability-key"])
def test_memory_ready_matches_what_the_proxy_accepts_for_per_user(
    capability_key: bool, valkey_server: ValkeyProcess, tmp_path: Path, started: list[ServiceProcess]
) -> None:
    docs = render("--set", f"proxy.capabilityKey.enabled={str(capability_key).lower()}")
    resolution = resolve_memory(agent(MemorySpec(per_user=True)), (), operator_config(docs, tmp_path))
    base_url = run_proxy(docs, valkey_server, tmp_path, started)
    # The user's capability, signed with the key the BFF shares with the proxy (when there is one).
    variables = proxy_env(docs, valkey_server, tmp_path, 0)
    key = Path(variables[env.CAPABILITY_KEY_FILE]).read_bytes() if capability_key else b"k" * 32
    capability = mint_capability(key, "alice", OWNER, 60)
    status = append(base_url, (), {api.USER_CAPABILITY_HEADER: capability})
    assert resolution.ready == (status == 200), (resolution.reason, status)
    assert status in (200, 401)
