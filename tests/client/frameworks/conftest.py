"""The real stack the frameworks' suites run against, once per module: a valkey-server, the proxy process
and the launcher process (as an agent pod runs it), so the suites' own event loops (``Runner.run_sync``
makes one per call) talk to it like an agent would."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sessionmem_core import env
from sessionmem_core.devauth import dev_token
from tests.support.processes import ServiceProcess, dev_proxy
from tests.support.valkey import ValkeyProcess, free_port


def pytest_configure(config: pytest.Config) -> None:
    # The SDK's redis session tests mark themselves ``serial`` (its xdist grouping); known here, so the
    # run does not warn of it.
    config.addinivalue_line("markers", "serial: upstream's own marker (the Agents SDK's xdist grouping)")


@dataclass(frozen=True)
class MemoryStack:
    memory_url: str  # the launcher's memory endpoint
    valkey_url: str  # the same valkey-server, for the controls (RedisSession) beside it


@pytest.fixture(scope="module")
def agent_settings() -> dict[str, str]:
    """The launcher's settings beyond the seed's defaults (what an AgentDeployment's ``spec.sessionMemory``
    sets): none, unless a suite's module overrides this fixture."""
    return {}


@pytest.fixture(scope="module")
def memory_stack(tmp_path_factory: pytest.TempPathFactory, agent_settings: dict[str, str]) -> Iterator[MemoryStack]:
    valkey = ValkeyProcess()
    valkey.start()
    proxy = dev_proxy(
        valkey.url,
        **{
            # The suites run hundreds of sessions in seconds; the rate quota has its own tests.
            env.QUOTA_REQUESTS_PER_SECOND: "1000000",
            env.QUOTA_BURST: "1000000",
            env.QUOTA_BYTES_PER_SECOND: str(1 << 40),
        },
    )
    proxy.start()
    token: Path = tmp_path_factory.mktemp("pod") / "token"
    token.write_text(dev_token("team-a", "support-agent"))
    memory_port = free_port()
    launcher = ServiceProcess(
        "sessionmem_launcher",
        {
            env.PROXY_URL: proxy.base_url,
            env.TOKEN_PATH: str(token),
            env.NAMESPACE: "team-a",
            env.AGENT: "support-agent",
            env.LAUNCHER_PORT: str(memory_port),
            env.SERVE_PORT: str(free_port()),
            env.AGENT_PORT: str(free_port()),
            **agent_settings,
        },
        memory_port,
    )
    launcher.start()
    yield MemoryStack(f"http://127.0.0.1:{memory_port}", valkey.url)
    launcher.stop()
    proxy.stop()
    valkey.close()


_TESTS = itertools.count()


class Namespaces:
    """Names that keep each test's sessions apart on the shared stack: the suites reuse session ids from
    test to test (each of their tests had a fresh database)."""

    current = "t0"

    @classmethod
    def next(cls) -> str:
        cls.current = f"t{next(_TESTS)}x{free_port()}"
        return cls.current


@pytest.fixture(autouse=True)
def test_namespace() -> str:
    return Namespaces.next()
