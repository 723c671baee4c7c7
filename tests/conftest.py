"""Shared fixtures: a real valkey-server, the real proxy process in dev-identity mode, and a launcher
running in the test's event loop (so its spans can be captured in memory)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sessionmem_core import env
from sessionmem_core.capability import new_key
from sessionmem_core.devauth import dev_token
from sessionmem_core.env import LauncherSettings
from sessionmem_demo.agent import app as agent_app
from sessionmem_launcher.server import Launcher
from tests.support.processes import ServiceProcess, dev_proxy
from tests.support.serving import serve_in_background
from tests.support.valkey import ValkeyProcess

pytest_plugins = ["tests.harness.fixtures"]

# The e2e tier needs root and brings a cluster up on this host: it runs only when named
# (`make e2e`, or `pytest tests/e2e`), never in the default run.
collect_ignore = ["e2e"]


@pytest.fixture
def valkey_server() -> Iterator[ValkeyProcess]:
    server = ValkeyProcess()
    server.start()
    yield server
    server.close()


@pytest.fixture
def proxy_process(valkey_server: ValkeyProcess) -> Iterator[ServiceProcess]:
    proc = dev_proxy(
        valkey_server.url,
        **{
            # Functional tests drive one agent far past a tenant's default rate; tests/proxy/test_quotas.py covers it.
            env.QUOTA_REQUESTS_PER_SECOND: "1000000",
            env.QUOTA_BURST: "1000000",
            env.QUOTA_BYTES_PER_SECOND: str(1 << 40),
        },
    )
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def dev_token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(dev_token("team-a", "support-agent"))
    return path


def launcher_settings(proxy: str, token_file: Path, **overrides: str) -> LauncherSettings:
    values = {
        env.PROXY_URL: proxy,
        env.TOKEN_PATH: str(token_file),
        env.NAMESPACE: "team-a",
        env.AGENT: "support-agent",
        env.LAUNCHER_PORT: "0",
        env.SERVE_PORT: "0",
        **overrides,
    }
    return LauncherSettings.from_env(values)


@pytest.fixture
def span_exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def demo_agent() -> AsyncIterator[int]:
    """The demo agent on a free port, in the test's event loop; yields its port."""
    server = await serve_in_background(agent_app)
    yield server.port
    await server.stop()


@pytest.fixture
async def launcher(
    proxy_process: ServiceProcess, dev_token_file: Path, demo_agent: int, span_exporter: InMemorySpanExporter
) -> AsyncIterator[Launcher]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    settings = launcher_settings(proxy_process.base_url, dev_token_file, **{env.AGENT_PORT: str(demo_agent)})
    instance = Launcher(settings, tracer_provider=provider, serve_host="127.0.0.1", serve=serve_in_background)
    await instance.start()
    yield instance
    await instance.stop()


@pytest.fixture
def capability_key(tmp_path: Path) -> bytes:
    key = new_key()
    (tmp_path / "capability-key").write_bytes(key)
    return key


@pytest.fixture
def per_user_proxy(valkey_server: ValkeyProcess, tmp_path: Path, capability_key: bytes) -> Iterator[ServiceProcess]:
    proc = dev_proxy(
        valkey_server.url,
        **{
            env.CAPABILITY_KEY_FILE: str(tmp_path / "capability-key"),
        },
    )
    proc.start()
    yield proc
    proc.stop()


# What a test needs, as markers (`pytest -m "not kube"`, `-m valkey`, ...): read from the fixtures it uses
# (pytest lists them transitively, so a proxy fixture brings its valkey-server) and from where it lives.
_VALKEY_FIXTURES = frozenset({"valkey_server", "valkey", "chart_valkey", "memory_stack"})
_KUBE_FIXTURES = frozenset({"kube_cluster", "kube_cluster_without_knative"})
_VALKEY_SOURCES = ("ValkeyProcess(", "ValkeyCluster(")
_FAULT_FOLDERS = ("faults", "adversarial")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    starts_valkey: dict[Path, bool] = {}
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        path = Path(str(item.fspath))
        if path not in starts_valkey:
            source = path.read_text() if path.suffix == ".py" else ""
            starts_valkey[path] = any(marker in source for marker in _VALKEY_SOURCES)
        if fixtures & _VALKEY_FIXTURES or starts_valkey[path]:
            item.add_marker(pytest.mark.valkey)
        if fixtures & _KUBE_FIXTURES:
            item.add_marker(pytest.mark.kube)
        if path.parent.name in _FAULT_FOLDERS:
            item.add_marker(pytest.mark.faults)
